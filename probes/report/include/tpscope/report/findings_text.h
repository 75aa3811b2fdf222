// The one text layout of findings and alerts, shared by `tpscope diagnose`, `tpscope alerts` and `tpscope capture`
// (its live alerts and its end-of-run diagnosis):
//
//   CRITICAL nan_origin          first NaN: rank 2 (tp 0, dp 1, host node-0) step 5 layer 1 ...
//                                a detail line
//   ALERT CRITICAL nonfinite_grad  rank 3 (host node-0)  step 5  layer 1  layers.1.mlp.fc1.weight
//         3 NaN in the gradient
//         evidence {"nan_count": 3}
//
// A finding's kind column is as wide as the widest kind of the catalogue (analysis::FindingKind), so a finding
// prints the same alone (capture prints them one by one) as in a list.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::report {

// "CRITICAL", "ERROR", "WARNING", "INFO"; any other stored name upper-cased as it is.
std::string severityLabel(std::string_view severityName);

// One finding, ending in a newline: severity, kind, message; its details below the message.
std::string findingText(const analysis::Finding& f);

// The root-cause chain (analysis/chain.h) as an indented tree, "→" before each consequence, each link's cost in
// brackets (when it cost something); nothing when the chain is empty:
//
//   root-cause chain (1 incident):
//   CRITICAL crash               rank 2 ... crashed  [costs 2 steps]
//     → ERROR    hang            tp-1 seq 12: rank 3 waits ...  [costs 2100.000 ms]
void printChain(const analysis::DiagnoseResult& r, std::ostream& out);

// The chain first (printChain), then every finding not in it ("other findings:"), then what was left out, the
// analyses that failed, and a count by severity of all findings ("6 findings: 1 critical, 5 info"); "no findings"
// when there are none; without a chain, the findings alone.
void printDiagnosis(const analysis::DiagnoseResult& r, std::ostream& out);

// One alert as a rank recorded it, with the rank's host when known (""), without a final newline:
// "ALERT SEVERITY kind  where", the message, and the evidence unless empty.
std::string alertText(const tracedb::AlertRow& a, std::string_view host);

}  // namespace tpscope::report
