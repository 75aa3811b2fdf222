#include "tpscope/tracedb/run_files.h"

#include <algorithm>
#include <charconv>

namespace tpscope::tracedb {

int64_t FileClock::shiftNs(int rank) const {
  if (aligned) return epochShiftNs;
  const auto it = clockOffsetNs.find(rank);
  return epochShiftNs + (it == clockOffsetNs.end() ? 0 : it->second);
}

Result<RunFiles> openRunFiles(std::span<const std::filesystem::path> paths, bool keepReaders) {
  RunFiles run;
  for (const auto& path : paths) {
    auto reader = Reader::open(path);
    if (!reader) return reader.status();
    RunFile f;
    f.path = path;
    f.reader = std::move(*reader);
    f.runId = f.reader->metaValue(meta_keys::kRunId).value_or("");
    const std::string epoch = f.reader->metaValue(meta_keys::kEpochUnixNs).value_or("0");
    std::from_chars(epoch.data(), epoch.data() + epoch.size(), f.clock.epochUnixNs);
    f.clock.aligned = f.reader->metaValue(meta_keys::kClockAligned).value_or("") == "1";
    auto ranks = f.reader->ranks();
    if (!ranks) return ranks.status();
    f.ranks = std::move(*ranks);
    for (const RankInfo& r : f.ranks) f.clock.clockOffsetNs[r.rank] = r.clockOffsetNs;
    if (!keepReaders) f.reader.reset();
    run.files.push_back(std::move(f));
  }
  if (run.files.empty()) return run;
  run.epochUnixNs = run.files.front().clock.epochUnixNs;
  for (const RunFile& f : run.files) run.epochUnixNs = std::min(run.epochUnixNs, f.clock.epochUnixNs);
  for (RunFile& f : run.files) f.clock.epochShiftNs = f.clock.epochUnixNs - run.epochUnixNs;
  return run;
}

}  // namespace tpscope::tracedb
