// writeDiagnosisFile (diagnose.h): the records of the rank files merged with each rank's end spans only
// (tracedb::merge, MergeSpans::Ends), and the summaries computed per rank file by the worker that reads it,
// through the same connection. Each file is opened twice (once for its epoch, once to read it) and its rows copied
// once, by one writer that prepares its statements once.
#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/run_files.h"
#include "workers.h"

namespace tpscope::analysis {

namespace {

// One rank file's summaries, its times on the file's own base, and the clock that moves them to the run's.
struct FileSummary {
  tracedb::FileClock clock;
  tracedb::RunSummary summary;
};

// The files' summaries as one, on the run's time base, by rank.
tracedb::RunSummary combine(std::vector<std::optional<FileSummary>>& parts) {
  tracedb::RunSummary run;
  run.version = kSummaryVersion;
  for (auto& p : parts) {
    for (tracedb::StepSummaryRow& r : p->summary.steps) {
      const int64_t shift = p->clock.shiftNs(r.rank);
      r.beginNs += shift;
      r.endNs += shift;
    }
    run.ranks.insert(run.ranks.end(), p->summary.ranks.begin(), p->summary.ranks.end());
    run.steps.insert(run.steps.end(), p->summary.steps.begin(), p->summary.steps.end());
    run.phases.insert(run.phases.end(), p->summary.phases.begin(), p->summary.phases.end());
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
  const size_t cores = detail::workersOn() ? std::max<size_t>(std::thread::hardware_concurrency(), 1) : 1;
  const size_t readers = std::clamp<size_t>(options.readers > 0 ? options.readers : cores, 1, kMaxDiagnosisReaders);
  std::vector<std::optional<FileSummary>> summaries(rankFiles.size());
  std::atomic<bool> pointToPoint{false};
  auto summarise = [&](size_t i, tracedb::Reader& reader, const tracedb::FileClock& clock) {
    auto summary = summaryFromRecords(reader);
    if (!summary) return summary.status();
    summaries[i].emplace(FileSummary{clock, std::move(*summary)});
    auto groups = reader.groups();
    if (!groups) return groups.status();
    if (reader.metaValue(tracedb::meta_keys::kPipeline) ||
        std::any_of(groups->begin(), groups->end(), [](const auto& g) { return isPointToPointGroup(g.name); }))
      pointToPoint = true;
    return tracedb::Status::ok();
  };
  auto merged = tracedb::merge(rankFiles, output,
                               {tracedb::MergeSpans::Ends, /*indexes=*/false, static_cast<int>(readers)}, summarise);
  if (!merged) return merged.status();
  // The query indexes diagnose uses. The (group, seq) index of the collectives serves only the lookups of pipeline
  // messages (desync of a p2p group, the pipeline report), and no query of diagnose reads grad_stats by step (the
  // viewer's heatmap does, on a run file): at 4,096 ranks the two take 10 s to sort, a sixth of the whole.
  namespace ix = tracedb::query_indexes;
  std::vector<std::string_view> indexes = {ix::kSpansRankBegin, ix::kSpansStep, ix::kCountersName, ix::kAlertsTs};
  if (pointToPoint) indexes.push_back(ix::kCollectivesGroupSeq);
  tracedb::Status s = tracedb::createQueryIndexes(output, indexes, static_cast<int>(readers));
  if (s) s = tracedb::writeSummary(output, combine(summaries));
  if (!s) removeFile(output);
  return s;
}

}  // namespace tpscope::analysis
