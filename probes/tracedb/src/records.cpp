#include "tpscope/tracedb/records.h"

#include <array>

namespace tpscope::tracedb {

std::string_view spanKindName(SpanKind kind) {
  static constexpr std::array<std::string_view, kSpanKindCount> kNames = {
      "compute", "comm", "data", "optimizer", "step", "checkpoint",
      "kernel", "memcpy", "memset", "nccl_kernel", "other", "wait"};
  const auto i = static_cast<size_t>(kind);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

std::string_view phaseName(Phase phase) {
  static constexpr std::array<std::string_view, 7> kNames = {"none", "fwd", "bwd", "optimizer", "data",
                                                             "checkpoint", "other"};
  const auto i = static_cast<size_t>(phase);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

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
