// The root-cause chain: one tree per incident, from the cause to its consequences, built over diagnose()'s
// findings and the reports they were drawn from (no second reading of the trace).
//
// A link is a finding (its kind, place, message and evidence) or a link derived from the cause's own reports (the
// waiting a straggler causes in each of its groups, the step time that waiting costs, a NaN's hops). Each link is
// sized by what it cost: `costNs` the wall time it cost the run, summed over the steps (−1: not sized in time),
// `costSteps` the steps it cost (−1: not sized in steps); per-step figures are in its evidence numbers.
//
// Links between findings rest on evidence, never on kind order or time order alone (docs/diagnosis.md, "Root-cause
// chain"): each rule returns the connection it found — a payload that carried the value, a wait on a late rank, a
// copy a rank computed from — in words and the rows that show it (ChainLink::because), or no link. Findings nothing
// connects are separate incidents (separate roots):
//   nan/inf origin, grad_spike → the silent_corruption it explains (sdc.h, explainDivergences: the divergence names
//                              its cause, with the rows that show the fault on the suspect)
//   desync (group g, seq s)  → a hang of g at seq ≥ s; a crash of a member of g whose last collective is in g at or
//                              after s − 1 (Gloo aborts every member on the mismatched collective)
//   crash of rank r          → a hang whose missing ranks include r
//   hang                     → a secondary hang whose missing ranks wait in it or are missing from it too
//   silent_corruption        → (unless another fault explains it) a NaN/Inf origin, spike or divergence from its
//                              earliest step on, on a rank holding a suspect copy (or run-wide); a later
//                              silent_corruption on ranks a process group joins to a suspect
//   nan/inf origin           → a spike or divergence at or after the origin step on the origin or a receiver
//   straggler r              → comm_overhead of a rank that waited on r (the members of r's groups) or of the run,
//                              where r caused more waiting than chance would (collectives.h)
//   grad_spike (rank, step)  → the run-wide grad spike of that step; the loss spike of that step (one batch) or of
//                              the next where the run-wide norm moved with it (the update used it); a replica
//                              divergence at that step whose values include the rank's
// A finding takes the first cause that names it (rules in the order above); one no rule names is its own root, so a
// kind no rule knows (a new analysis) is a root. The chain holds the roots whose tree has a warning or worse,
// most severe first (the findings' order); a healthy run's chain is empty.
//
// Threading: pure function of its inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {

// What connects a consequence to its cause: one line, and the rows that show it.
struct LinkReason {
  std::string text;
  std::vector<EvidenceRow> rows;
  bool operator==(const LinkReason&) const = default;
};

struct ChainLink {
  std::string kind;  // a finding kind ("straggler", ...), or a derived link: "group_wait", "step_time", "spread"
  Severity severity = Severity::Info;
  int rank = -1, step = -1, layer = -1;
  std::optional<CollectiveRef> collective;
  std::string message;     // one line: what happened and what it cost
  int64_t costNs = -1;     // wall time it cost the run (over all steps); −1: not sized in time
  int64_t costSteps = -1;  // steps it cost; −1: not sized in steps
  Evidence evidence;
  int finding = -1;        // index into the findings the chain was built from; −1 for a derived link
  std::optional<LinkReason> because;  // a finding under its cause: the connection; empty for roots and derived links
  std::vector<ChainLink> consequences;
};

// What the chain may size its links with; any may be null (those links are then left out or unsized).
struct ChainInputs {
  const RunInfo* info = nullptr;
  const Breakdown* breakdown = nullptr;
  const CollectiveAnalysis* collectives = nullptr;
  const DesyncReport* desync = nullptr;
  const NonFiniteReport* nonfinite = nullptr;
};

// The roots, most severe first. `findings` sorted (findingLess), as diagnose() returns them.
std::vector<ChainLink> buildChain(const std::vector<Finding>& findings, const ChainInputs& inputs = {});

// Every finding index that appears in the chain (roots and consequences), sorted.
std::vector<int> chainFindings(const std::vector<ChainLink>& chain);

}  // namespace tpscope::analysis
