// writeDiagnosisFile (diagnose.h): the records of the rank files merged with each rank's end spans only, and the
// summaries computed per rank file. A thread per core merges a share of the files into a part; the parts are then
// merged into the diagnosis file while the other cores summarise the files. Merging the parts copies every record a
// second time, but one thread merging every rank file is slower: per file, one ATTACH with its schema parsed and the
// copy statements prepared again (4,096 rank files on 2 cores: 33 s for the parts and 39 s for the file, against
// 75 s for one merge of every file).
#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/run_files.h"
#include "workers.h"

namespace tpscope::analysis {

namespace {

// One rank file's summaries, its times on the file's own base, and the clock to move them to the run's.
struct FileSummary {
  tracedb::Status status;
  tracedb::FileClock clock;
  tracedb::RunSummary summary;
};

FileSummary summarizeFile(const std::filesystem::path& path) {
  FileSummary out;
  auto run = tracedb::openRunFiles(std::span(&path, 1));
  if (!run) {
    out.status = run.status();
    return out;
  }
  tracedb::RunFile& file = run->files.front();
  out.clock = file.clock;
  auto summary = summaryFromRecords(*file.reader);
  if (!summary) out.status = summary.status();
  else out.summary = std::move(*summary);
  return out;
}

// The files' summaries as one, on the run's time base (the earliest epoch: run_files.h), by rank.
tracedb::RunSummary combine(std::vector<FileSummary>& parts) {
  int64_t epoch = parts.front().clock.epochUnixNs;
  for (const FileSummary& p : parts) epoch = std::min(epoch, p.clock.epochUnixNs);
  tracedb::RunSummary run;
  run.version = kSummaryVersion;
  for (FileSummary& p : parts) {
    p.clock.epochShiftNs = p.clock.epochUnixNs - epoch;
    for (tracedb::StepSummaryRow& r : p.summary.steps) {
      const int64_t shift = p.clock.shiftNs(r.rank);
      r.beginNs += shift;
      r.endNs += shift;
    }
    run.ranks.insert(run.ranks.end(), p.summary.ranks.begin(), p.summary.ranks.end());
    run.steps.insert(run.steps.end(), p.summary.steps.begin(), p.summary.steps.end());
    run.phases.insert(run.phases.end(), p.summary.phases.begin(), p.summary.phases.end());
  }
  // Files in any order: the rows by rank, each file's own order kept within a rank.
  auto byRank = [](const auto& a, const auto& b) { return a.rank < b.rank; };
  std::stable_sort(run.ranks.begin(), run.ranks.end(), byRank);
  std::stable_sort(run.steps.begin(), run.steps.end(), byRank);
  std::stable_sort(run.phases.begin(), run.phases.end(), byRank);
  return run;
}

void removeFile(const std::filesystem::path& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-journal", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix, ec);
}

}  // namespace

tracedb::Status writeDiagnosisFile(std::span<const std::filesystem::path> rankFiles,
                                   const std::filesystem::path& output, const DiagnosisFileOptions& options) {
  if (rankFiles.empty()) return tracedb::Status::error(output.string() + ": no rank files to diagnose");
  const size_t cores =
      detail::workersOn() ? std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMaxDiagnosisParts) : 1;
  // A part per core, of consecutive files (the parts in order keep the files' order); one part: the output itself.
  const size_t perPart = std::max<size_t>(1, options.minFilesPerPart);
  const size_t partCount = std::clamp<size_t>((rankFiles.size() + perPart - 1) / perPart, 1,
                                              std::min(options.parts > 0 ? options.parts : cores, kMaxDiagnosisParts));
  std::vector<std::filesystem::path> partPaths;
  for (size_t p = 0; p < partCount; ++p)
    partPaths.push_back(partCount == 1 ? output
                                       : std::filesystem::path(output.string() + ".part-" + std::to_string(p)));
  auto fail = [&](tracedb::Status s) {
    for (const auto& path : partPaths) removeFile(path);
    removeFile(output);
    return s;
  };
  auto mergeInto = [&](std::span<const std::filesystem::path> in, const std::filesystem::path& out,
                       tracedb::MergeSpans spans) {
    auto m = tracedb::merge(in, out, {spans, /*indexes=*/out == output});
    return m ? tracedb::Status::ok() : m.status();
  };
  if (partCount > 1) {  // the parts on every core
    std::vector<tracedb::Status> merged(partCount);
    std::vector<std::thread> threads;
    for (size_t p = 0; p < partCount; ++p)
      threads.emplace_back([&, p]() {
        const size_t from = rankFiles.size() * p / partCount, to = rankFiles.size() * (p + 1) / partCount;
        merged[p] = mergeInto(rankFiles.subspan(from, to - from), partPaths[p], tracedb::MergeSpans::Ends);
      });
    for (auto& t : threads) t.join();
    for (const tracedb::Status& s : merged)
      if (!s) return fail(s);
  }
  // The last merge (of the parts, or of the files when there is one part) takes one core: the files are summarised
  // on the others meanwhile, and on this one once the merge is done.
  std::vector<FileSummary> summaries(rankFiles.size());
  std::atomic<size_t> next{0};
  auto summarise = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < rankFiles.size();) summaries[i] = summarizeFile(rankFiles[i]);
  };
  std::vector<std::thread> workers;
  for (size_t w = 1; w < cores; ++w) workers.emplace_back(summarise);
  // The parts hold the kept spans only: all of them are taken.
  const tracedb::Status last = partCount > 1 ? mergeInto(partPaths, output, tracedb::MergeSpans::All)
                                             : mergeInto(rankFiles, output, tracedb::MergeSpans::Ends);
  if (!last) next.store(rankFiles.size());  // nothing more to summarise
  summarise();
  for (auto& t : workers) t.join();
  if (partCount > 1)
    for (const auto& path : partPaths) removeFile(path);
  if (!last) return fail(last);
  for (const FileSummary& s : summaries)
    if (!s.status) return fail(s.status);
  if (tracedb::Status s = tracedb::writeSummary(output, combine(summaries)); !s) return fail(s);
  return tracedb::Status::ok();
}

}  // namespace tpscope::analysis
