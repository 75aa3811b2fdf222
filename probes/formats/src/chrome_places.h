// What a Chrome trace's own args say about its events beyond Kineto's, as tpscope's Chrome export writes them (and
// pipeline traces may): a span's "cat" naming a tpscope span kind ("compute", "comm", "wait", ...) sets its kind
// where the Kineto rules found none; args "step", "layer", "phase" set its place in training; and an event of
// cat "collective" with args "group", "seq" and "op" is a collective record (a row of `collectives`, not a span):
// enqueue_ns from its args, start and end from ts/dur, state, dtype, bytes, shape, step, layer, phase, callsite
// from its args. docs/formats.md "Chrome traces".
#pragma once

#include <vector>

#include "kineto_model.h"
#include "kineto_parse.h"

namespace tpscope::formats::kineto {

// Applies the args of `file`'s spans to `m` (index-aligned with file.spans, as buildRankModel leaves it) and
// appends the collective records to m.collectives. Returns per span whether it was a collective record (to be
// dropped by dropSpans once everything index-aligned is done).
std::vector<char> applyPlaceArgs(const KinetoFile& file, RankModel& m);

// Removes the spans marked in `drop` and the host lanes left without any span.
void dropSpans(RankModel& m, const std::vector<char>& drop);

}  // namespace tpscope::formats::kineto
