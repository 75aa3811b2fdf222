#include "tpscope/tracedb/records.h"

#include <array>

#include "tpscope/probes/probes.h"

namespace tpscope::tracedb {

std::string_view spanKindName(SpanKind kind) {
  static constexpr std::array<std::string_view, kSpanKindCount> kNames = {
      "compute", "comm", "data", "optimizer", "step", "checkpoint",
      "kernel", "memcpy", "memset", "nccl_kernel", "other", "wait"};
  const auto i = static_cast<size_t>(kind);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

// The names are the probe API's (one table); the numbering is the same, checked here.
static_assert(static_cast<int>(Phase::Backward) == static_cast<int>(probes::Phase::Backward) &&
              static_cast<int>(Phase::Other) == static_cast<int>(probes::Phase::Other));
std::string_view phaseName(Phase phase) { return probes::phaseName(static_cast<probes::Phase>(phase)); }

namespace {
constexpr std::array<std::string_view, 5> kStateNames = {"scheduled", "started", "completed", "timed_out", "failed"};
}

std::string_view collectiveStateName(CollectiveState state) {
  const auto i = static_cast<size_t>(state);
  return i < kStateNames.size() ? kStateNames[i] : std::string_view("unknown");
}

std::optional<CollectiveState> parseCollectiveState(std::string_view name) {
  for (size_t i = 0; i < kStateNames.size(); ++i)
    if (kStateNames[i] == name) return static_cast<CollectiveState>(i);
  return std::nullopt;
}

}  // namespace tpscope::tracedb
