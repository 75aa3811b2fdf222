// JSON forms of the analyses (the stable contracts of `tpscope diagnose --json` and `report --json`, documented in
// docs/diagnosis.md). Output is deterministic: keys in a fixed order, numbers as integers where they are counts, ns
// or bytes; reals with up to 6 significant digits. Kept out of the structs' headers so users of the structs need
// no JSON library.
#pragma once

#include <string>

#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/report.h"

namespace tpscope::report {

inline constexpr int kDiagnosisJsonVersion = 1;  // "version" in the diagnose JSON

// {"version":1,"file":...,"findings":[{kind,severity,rank,step,layer,collective:{group,seq,op}|null,ranks,message,
//   details,evidence:{rows:[{table,key:{...}}],rows_omitted,numbers:{...}}}],"errors":[...],"omitted":{...}}
std::string diagnosisToJson(const analysis::DiagnoseResult& result, const std::string& file, int indent = 2);
// {"file", "step_source", "ranks":[{rank,steps,step_ns,compute_ns,comm_ns,exposed_comm_ns,other_ns,idle_ns,
//   comm_overhead_pct}], "steps":[...], "run":{...}, "collectives":[{group,op,group_size,count,bytes,total_ns,
//   latency_ns,algbw_gbps,busbw_gbps,mean_skew_ns,max_skew_ns}], "stragglers":{...}, "tp_model":{...},
//   "pipeline":{...} (pipeline runs), "kernels":{count,total_ms,top:[{name,count,total_ms}]} (device lanes)}
std::string reportToJson(const analysis::Report& report, const std::string& file, int indent = 2);
std::string desyncToJson(const analysis::DesyncReport& report, const std::string& file, int indent = 2);
std::string diffToJson(const analysis::RunDiff& diff, const std::string& fileA, const std::string& fileB, int indent = 2);

}  // namespace tpscope::report
