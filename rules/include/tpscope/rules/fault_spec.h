// Fault specifications for `tpscope capture --inject` and `tpscope-train --inject` — the pure, LibTorch-free part
// (target tpscope_rules, linked by the CLI to validate specs before any rank starts, and by core to run them).
//
// Design: a spec is KIND ':' KEY '=' VALUE (',' KEY '=' VALUE)* — no spaces; keys in any order, each at most once —
// parsed into a FaultSpec that formats back to the same canonical text, so capture hands the ranks exactly what it
// validated (TPSCOPE_INJECT; lists join specs with ';'). The kinds and their keys are listed at parseFaultSpec;
// core/faults.h carries each one out on the code path it breaks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpscope::rules {

enum class FaultKind : uint8_t { Nan, Inf, Spike, Hang, Mismatch, Slow, Delay, Crash, Bitflip };
enum class FaultPhase : uint8_t { Any, Forward, Backward };

std::string_view faultKindName(FaultKind kind);  // "nan", "inf", ...

struct FaultSpec {
  FaultKind kind = FaultKind::Nan;
  int rank = 0;
  int step = -1;        // -1: every step (slow, delay)
  int layer = -1;       // -1: not given
  double factor = 1.0;  // spike
  int64_t ms = 0;       // slow, delay
  FaultPhase phase = FaultPhase::Any;  // nan/inf: Any means backward (the gradient)
  std::string tensor;                  // bitflip: a parameter name, kBitflipAllReduce, or "" (the default target)
  int bit = -1;                        // bitflip: -1 means kDefaultFlipBit
  int stage = -1;       // stage=S given: the fault's rank is stage S's first (StepHooks resolves it); -1: rank=R
  int microbatch = -1;  // mb=K: only in micro-batch K's passes; -1: any
};

// bitflip's tensor= value that targets an all-reduce result instead of a parameter.
inline constexpr std::string_view kBitflipAllReduce = "allreduce";
inline constexpr int kDefaultFlipBit = 20;  // an fp32 mantissa bit: a silent change (~1e-1 relative), never NaN

// Parses one spec. On failure returns nullopt and sets `error` to a message that quotes the spec and says what is
// wrong and what is expected (e.g. "--inject 'nan:rank=1': missing step=S (nan:rank=R,step=S[,layer=L])").
//   nan:rank=R,step=S[,layer=L][,phase=fwd|bwd]
//                                     a NaN enters rank R at step S: phase=bwd (the default) in the gradient of layer
//                                     L's first parameter; phase=fwd in layer L's output activation (forward pass)
//   inf:rank=R,step=S[,layer=L][,phase=fwd|bwd]   the same with +Inf
//   spike:rank=R,step=S,factor=F      rank R's gradients are multiplied by F (> 0) at step S
//   hang:rank=R,step=S[,phase=fwd|bwd] rank R never enters its first collective of step S (of that phase)
//   mismatch:rank=R,step=S[,phase=fwd|bwd]
//                                     rank R's first all-reduce of step S (of that phase) carries one element too many
//   slow:rank=R,ms=M[,step=S]         rank R computes M ms longer every step (a straggler); with step=S only at the
//                                     start of step S (a rank stuck in compute for M ms: a span "injected slow
//                                     compute" open all along)
//   delay:rank=R,ms=M                 rank R arrives M ms late at every collective
//   crash:rank=R,step=S               rank R aborts (SIGABRT) at the start of step S
//   bitflip:rank=R,step=S[,tensor=NAME|allreduce][,bit=B][,phase=fwd|bwd]
//                                     one bit (B, default 20) of element 0 flips on rank R at step S: of parameter
//                                     NAME after the optimizer update (default: the first TP-replicated parameter),
//                                     or, with tensor=allreduce, of the result of rank R's first all-reduce of step S
//                                     (of that phase). Silent data corruption: found by the replica fingerprints
//                                     (replica_check.h). B counts from the least significant bit of the element.
// Pipeline placement: stage=S in place of rank=R puts the fault on stage S's first rank (TP rank 0, DP rank 0:
// global rank S × TP × DP), on a run with --pp > 1; mb=K (nan, inf, hang) fires it in micro-batch K's pass only
// (nan/inf: that micro-batch's forward pass, phase=fwd, or its backward pass; hang: the first collective or
// point-to-point message of that micro-batch's passes).
// Ranks are global ranks (0-based); steps are 1-based optimizer steps; layers 0-based transformer layers;
// micro-batches 0-based, below --microbatches.
std::optional<FaultSpec> parseFaultSpec(std::string_view text, std::string* error);
// Parses a ';'-separated list (TPSCOPE_INJECT; empty entries are ignored). nullopt + `error` on the first bad entry.
std::optional<std::vector<FaultSpec>> parseFaultList(std::string_view text, std::string* error);
// The canonical text of a spec; parseFaultSpec(formatFaultSpec(s)) == s.
std::string formatFaultSpec(const FaultSpec& spec);
std::string formatFaultList(const std::vector<FaultSpec>& specs);
// Empty when the spec fits a job of `worldSize` ranks (and `layers` transformer layers, when known: > 0; and
// `stages` pipeline stages, when known: > 0); otherwise the reason, naming the spec.
std::string checkFaultSpec(const FaultSpec& spec, int worldSize, int layers = 0, int stages = 0);

bool operator==(const FaultSpec& a, const FaultSpec& b);

}  // namespace tpscope::rules
