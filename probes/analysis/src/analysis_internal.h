// Internal: the analyses over a preloaded collective table, so diagnose() and buildReport() scan the collectives once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "collective_table.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/crash.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis::detail {

CollectiveAnalysis analyzeCollectives(const CollectiveTable& table, const RunInfo& info);
tracedb::Result<DesyncReport> analyzeDesync(tracedb::Reader& reader, const RunInfo& info, const CollectiveTable& table);
tracedb::Result<RunInfo> loadRunInfo(tracedb::Reader& reader, const CollectiveTable& table);
tracedb::Result<std::vector<RankEnd>> analyzeRankEnds(tracedb::Reader& reader, const RunInfo& info,
                                                      const CollectiveTable& table);

// Meta 'pipeline', the engine's schedule, read in one place for the run info (which ranks hold which stage) and the
// pipeline analysis (the schedule). nullopt when the meta is absent or not a JSON object; fields of the wrong type
// read as their defaults, a stage that is not an integer as -1.
struct PipelineLayout {
  std::string schedule;
  int stages = 0, microbatches = 0, virtualStages = 1;
  std::vector<int> stageOfRank;
};
std::optional<PipelineLayout> readPipelineLayout(tracedb::Reader& reader);

}  // namespace tpscope::analysis::detail
