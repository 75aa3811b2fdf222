// `tpscope replay`'s verdicts (cli/src/cmd_replay.cpp, docs/cli.md "replay"), stored in the replayed run as alerts of
// kind `replay`, as findings of kind replay: one per replayed step (the latest replay of it). rank: the rank whose
// operator is named (the replay's origin), else the rank asked about; step: the step; layer: the operator's layer.
// Severity: info for reproducible and clean (the replay is evidence about a cause the other findings name), warning for
// transient (clean again: suspect the hardware). Evidence: the alert row, and numbers verdict, op, pass, span,
// produced (0/1), ops_checked. The root-cause chain hangs it under the NaN/Inf origin of its step (chain.h).
// The op check armed live (--on-nonfinite trace-ops: alerts of kind op_check with evidence live = true) gives one
// more: verdict "traced", step: where it named the operator, after_step: the step whose non-finite value armed it
// (the origin it hangs under).
#pragma once

#include <vector>

#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

tracedb::Result<std::vector<Finding>> replayFindings(tracedb::Reader& reader);

}  // namespace tpscope::analysis
