// Internal: the analyses over a preloaded collective table, so diagnose() scans the collectives once.
#pragma once

#include "collective_table.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"

namespace tpscope::analysis::detail {

CollectiveAnalysis analyzeCollectives(const CollectiveTable& table, const RunInfo& info);
tracedb::Result<DesyncReport> analyzeDesync(tracedb::Reader& reader, const RunInfo& info, const CollectiveTable& table);

}  // namespace tpscope::analysis::detail
