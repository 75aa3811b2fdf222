// Internal: the analyses over a preloaded collective table, so diagnose() and buildReport() scan the collectives once.
#pragma once

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

}  // namespace tpscope::analysis::detail
