// The root-cause chain: one tree per incident, from the cause to its consequences, built over diagnose()'s
// findings and the reports they were drawn from (no second reading of the trace). Pure function of its inputs.
//
// A link is a finding or a link derived from the cause's own reports (the waiting a straggler causes in each of its
// groups, the step time that waiting costs, a NaN's hops), sized by what it cost. Links between findings rest on
// evidence, never on kind order or time order alone: each rule returns the connection it found (a payload that
// carried the value, a wait on a late rank, a copy a rank computed from), or no link. A finding takes the first
// cause that names it; one no rule names is its own root, so a kind no rule knows (a new analysis) is a root.
// docs/diagnosis.md ("Root-cause chain") lists the rules, cause by consequence, and the derived links.
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

// What connects a consequence to its cause: one line, and the rows that show it (ChainLink::because).
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
  int64_t costSteps = -1;  // steps it cost; −1: not sized in steps (per-step figures: its evidence numbers)
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

// The roots whose tree has a warning or worse, most severe first (then in the findings' order); a healthy run's chain
// is empty. `findings` sorted (findingLess), as diagnose() returns them. Findings nothing connects are separate
// roots; no link closes a loop.
std::vector<ChainLink> buildChain(const std::vector<Finding>& findings, const ChainInputs& inputs = {});

// Every finding index that appears in the chain (roots and consequences), sorted.
std::vector<int> chainFindings(const std::vector<ChainLink>& chain);

}  // namespace tpscope::analysis
