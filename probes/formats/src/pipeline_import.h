// Pipeline-parallel traces of other engines, brought to tpscope's pipeline contract (docs/schema.md "Pipeline
// spans", "Point-to-point records", meta 'pipeline'; docs/formats.md "Pipeline-parallel traces") so that the bubble,
// stage-imbalance and straggler analyses read them as they read a capture.
//
// Per rank (recognisePipelineRank, while the rank's file is loaded): pass spans — Megatron-style "forward-compute"
// / "backward-compute" or tpscope's own "forward mb K" [" chunk C"] — get their step, micro-batch and chunk and are
// renamed "forward mb K" / "backward mb K" [" chunk C"] (kind compute, phase fwd/bwd); transfer spans —
// "forward-recv", "backward-send", "forward-send-backward-recv", ... — become comm spans "recv" (any receive in it)
// or "send wait" (sends only), and each message in them is kept for the run-level pairing.
//   step: the span's args "step" / "iteration" (or its ProfilerStep#) when every pass has one; else optimizer spans
//         (kind optimizer, or a name starting "optimizer"): a step ends with each run of optimizer spans after a
//         pass; else the pipeline flush: a step ends when every forward pass begun in it has had its backward
//         pass and a forward pass follows. Steps count from 0 at the rank's first pass.
//   micro-batch: the name's ("forward mb 3"), else args "mb_id" / "microbatch" / "micro_batch" / "microbatch_id",
//         else the pass's order among the step's passes of its direction and chunk. Chunk: the name's, else args
//         "model_chunk" / "chunk_id" / "virtual_pp_rank", else 0.
//   a message's micro-batch: its span's args, else that of the nearest pass it serves (a send's previous pass of
//         the message's direction, a receive's next one).
//   a receive's wait: from the end of the rank's previous pass or transfer span on the same thread in the same step
//         (the gap before it) to the span's begin — so a span that shows only the transfer still has its wait; a
//         span that covers the wait itself has no gap before it.
// Per run (assemblePipeline): each message's peer is the neighbouring stage with the same TP and DP coordinates
// (an activation goes to stage s+1, a gradient to s−1; around the ring only with several model chunks); the
// sends and receives of one directed pair are paired in order of begin, seq 1, 2, ...; unpaired messages are
// counted in `skipped`, not written.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kineto_model.h"
#include "kineto_parse.h"
#include "pipeline_names.h"

namespace tpscope::formats::kineto {

struct PipelineRank {
  struct Pass {
    int step = 0, microbatch = 0, chunk = 0;
    bool forward = true;
    int64_t beginNs = 0;  // absolute
  };
  struct Message {
    PipeMessage what;
    int microbatch = -1, step = -1, thread = 0;
    int64_t waitFromNs = 0, beginNs = 0, endNs = 0;  // absolute
    int64_t bytes = -1;
  };
  std::vector<Pass> passes;  // in order of begin
  std::vector<Message> messages;
  std::deque<std::string> names;  // the renamed spans' names (the intern function keeps views of them)
};

// Recognises `file`'s pass and transfer spans (contract above) and rewrites their rows in `m` (index-aligned with
// file.spans); fills `out`. Nothing changes for a trace without such names.
tracedb::Status recognisePipelineRank(const KinetoFile& file, RankModel& m, const InternFn& intern,
                                      PipelineRank& out);

struct PipelineRankRef {
  int rank = 0;
  RankCoords coords;
  PipelineRank* pipe = nullptr;
  RankModel* model = nullptr;
};

// Pairs the ranks' messages into point-to-point records (appended to the models' collectives; their p2p groups to
// `groups`) and returns meta 'pipeline' as JSON — schedule (interleaved with several chunks; gpipe when on every
// rank and step all forward passes begin before the first backward pass; else 1f1b), stages, microbatches (the
// most distinct micro-batches of any rank's step), virtual_stages (distinct chunks), stage_of_rank (−1 where not
// named) — or "" when the run names fewer than two stages or has no pass spans. Problems are counted in `skipped`.
std::string assemblePipeline(std::vector<PipelineRankRef>& ranks, std::map<std::string, tracedb::GroupInfo>& groups,
                             std::map<std::string, int64_t>& skipped);

}  // namespace tpscope::formats::kineto
