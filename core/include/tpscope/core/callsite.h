// Callsite: where in the model a collective was issued, in TP terms. Cheap to pass: `what` is a static string,
// the human-readable callsite ("layer 3 attention output RowParallel forward all-reduce") is built only while a
// probe sink is recording.
#pragma once

#include <string>

#include "tpscope/probes/probes.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::core {

struct Callsite {
  const char* what = "";  // static string: "attention output RowParallel", "gradient bucket 2", ...
  int layer = -1;         // transformer layer, -1 when not inside one
};

// "layer 3 attention output RowParallel forward all-reduce"; `op` is the logical op, named with hyphens where it has
// two words ("all-reduce", "all-gather", "reduce-scatter"), else by the catalogue's name ("broadcast", "send").
std::string describeCallsite(const Callsite& site, probes::Phase phase, vocabulary::CollectiveOp op);

// The word for a phase in a callsite description ("forward", "backward", ...; the stored names are
// probes::phaseName's "fwd", "bwd").
const char* callsitePhaseWord(probes::Phase phase) noexcept;

}  // namespace tpscope::core
