// Names in Chrome / Kineto traces of pipeline-parallel runs and what they mean for tpscope (docs/formats.md,
// "Pipeline-parallel traces"): the ranks a process or thread name carries, Megatron-style timer names, tpscope's own
// pass names, span kind and phase names. Pure functions, no state; shared by the importer and its tests.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kineto_parse.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::formats::kineto {

// The rank coordinates a process or thread name carries: "PP rank 2, TP rank 0", "pp_rank=2 tp_rank=0 dp_rank=1",
// "PP2 TP0", "pipeline rank 1" is not one (pp/tp/dp must be spelled so); sizes as "tp 1/2"; a global rank as
// "rank 5" or "global_rank=5" (tpscope's export: "rank 5 (host) tp 1/2 dp 0/1 pp 1/2"). Case-insensitive; text in
// parentheses (a host name) is not read. Nothing set when the name carries none.
RankCoords coordsFromName(std::string_view name);

// One point-to-point message a span stands for: sent or received, an activation (travels to the next stage) or an
// activation gradient (travels to the previous one).
struct PipeMessage {
  bool send = false;
  bool activation = true;
};

// What a span's name says it is in a pipeline schedule.
struct PipeName {
  enum class Role : uint8_t { None, Pass, Transfer } role = Role::None;
  bool forward = true;              // Pass: a forward (else backward) pass
  int microbatch = -1, chunk = -1;  // from tpscope's own pass names ("forward mb 3 chunk 1")
  std::array<PipeMessage, 4> messages{};  // Transfer: the messages, in the name's order
  int messageCount = 0;
};

// Megatron-style timer names (forward-compute, backward-compute, forward-recv, forward-send, backward-recv,
// backward-send, forward-send-backward-recv, backward-send-forward-recv, forward-backward-send-forward-backward-recv;
// '_' for '-' and any case accepted) and tpscope's "forward mb K" / "backward mb K" [" chunk C"].
PipeName pipelineName(std::string_view name);

// tpscope's span kind and phase names (spanKindName, phaseName) read back; nullopt for any other text.
std::optional<tracedb::SpanKind> spanKindFromName(std::string_view name);
std::optional<tracedb::Phase> phaseFromName(std::string_view name);

// The callsite tpscope gives a point-to-point record: "pipeline activation of micro-batch 3 forward send",
// "pipeline activation gradient of micro-batch 3 backward recv" (the schema's point-to-point records).
std::string pipelineCallsite(const PipeMessage& message, int microbatch);

}  // namespace tpscope::formats::kineto
