// The catalogue of collective operations: one enum, the name the trace stores for each (collectives.op, the
// importers' output), and one reader of every spelling tpscope meets — c10d's ("allreduce", "c10d::_allgather_base_",
// "reduce_scatter_tensor_coalesced"), a backend's and Flight Recorder's profiling names ("nccl:all_reduce",
// "gloo:all_gather", "nccl:send 1->2"), Kineto's record_param_comms metadata, NCCL's kernel names
// ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_float") and NCCL's NVTX ranges
// ("ncclAllReduce") as nsys shows them. Header-only and dependency-free (the vocabulary's rule).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace tpscope::vocabulary {

enum class CollectiveOp : uint8_t {
  AllReduce, AllGather, ReduceScatter, Broadcast, Barrier, AllToAll,  // the ops with a colour (colours.h), in its order
  Reduce, Gather, Scatter, Send, Recv, SendRecv,
  Coalesced,  // a coalesced call of several ops (Flight Recorder's "coalesced")
  Unknown,    // not a collective, or one this catalogue does not know (record_param_comms, ncclDevKernel_Generic)
};
inline constexpr size_t kCollectiveOpCount = static_cast<size_t>(CollectiveOp::Unknown);
inline constexpr size_t kColouredOpCount = 6;

// The stored spelling of each op, in enum order.
inline constexpr std::array<std::string_view, kCollectiveOpCount> kCollectiveOpNames = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", "reduce",
    "gather",     "scatter",    "send",           "recv",      "send_recv", "coalesced"};

// The same spellings without their underscores, c10d's other spelling of them ("allreduce"), in enum order; kept
// beside the names so that matching a name allocates nothing (checked against them below).
inline constexpr std::array<std::string_view, kCollectiveOpCount> kSqueezedOpNames = {
    "allreduce", "allgather", "reducescatter", "broadcast", "barrier", "alltoall", "reduce",
    "gather",    "scatter",   "send",          "recv",      "sendrecv", "coalesced"};

namespace detail {
// a == b once every '_' of both is left out ("all_gather" == "allgather" == "allgather_").
constexpr bool equalIgnoringUnderscores(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  for (;;) {
    while (i < a.size() && a[i] == '_') ++i;
    while (j < b.size() && b[j] == '_') ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    if (a[i++] != b[j++]) return false;
  }
}
constexpr bool squeezedNamesMatch() {
  for (size_t i = 0; i < kCollectiveOpCount; ++i)
    if (!equalIgnoringUnderscores(kCollectiveOpNames[i], kSqueezedOpNames[i]) ||
        kSqueezedOpNames[i].find('_') != std::string_view::npos)
      return false;
  return true;
}
static_assert(squeezedNamesMatch(), "kSqueezedOpNames is kCollectiveOpNames without underscores");
}  // namespace detail

// "all_reduce", ...; "" for Unknown.
constexpr std::string_view opName(CollectiveOp op) {
  const auto i = static_cast<size_t>(op);
  return i < kCollectiveOpCount ? kCollectiveOpNames[i] : std::string_view();
}

// What a spelling says: the op, and whether it names the coalesced variant ("allreduce_coalesced").
struct OpSpelling {
  CollectiveOp op = CollectiveOp::Unknown;
  bool coalesced = false;
};

namespace detail {

inline std::string lowerAscii(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// One bare name, lower-case, without prefix: the catalogue's spelling, c10d's aliases, or either with the variant
// suffixes of c10d's tensor and coalesced entry points, with or without underscores ("allgather", "all_gather").
inline OpSpelling readBareOp(std::string_view bare) {
  while (!bare.empty() && bare.front() == '_') bare.remove_prefix(1);
  while (!bare.empty() && bare.back() == '_') bare.remove_suffix(1);
  static constexpr std::pair<std::string_view, CollectiveOp> kAliases[] = {
      {"monitored_barrier", CollectiveOp::Barrier}, {"batch_isend_irecv", CollectiveOp::SendRecv},
      {"recv_any_source", CollectiveOp::Recv},      {"recvanysource", CollectiveOp::Recv},
      {"all_to_allv", CollectiveOp::AllToAll},      {"alltoallv", CollectiveOp::AllToAll}};
  for (const auto& [alias, op] : kAliases)
    if (bare == alias) return {op, false};
  OpSpelling out;
  std::string_view s = bare;
  for (std::string_view suffix : {"_coalesced", "_into_tensor", "_tensor", "_base", "_single", "_sparse"}) {
    if (s.size() <= suffix.size() || !s.ends_with(suffix)) continue;
    s.remove_suffix(suffix.size());
    if (suffix == "_coalesced") out.coalesced = true;
  }
  for (size_t i = 0; i < kCollectiveOpCount; ++i)
    if (equalIgnoringUnderscores(s, kCollectiveOpNames[i])) {
      out.op = static_cast<CollectiveOp>(i);
      return out;
    }
  return {};
}

}  // namespace detail

// Every spelling above; Unknown for anything else (record_param_comms, "nccl:", "c10d::wait", "ncclGroupStart").
inline OpSpelling parseOp(std::string_view name) {
  if (name.starts_with("void ")) name.remove_prefix(5);
  for (std::string_view kernel : {"ncclDevKernel_", "ncclKernel_"}) {
    if (!name.starts_with(kernel)) continue;
    name.remove_prefix(kernel.size());  // the op is the first token: AllReduce, SendRecv, Generic, ...
    return detail::readBareOp(detail::lowerAscii(name.substr(0, name.find_first_of("_(<"))));
  }
  if (name.size() > 4 && name.starts_with("nccl") && name[4] >= 'A' && name[4] <= 'Z')  // NCCL's NVTX: ncclAllReduce
    return detail::readBareOp(detail::lowerAscii(name.substr(4)));
  name = name.substr(0, name.find(' '));  // Flight Recorder's peers: "nccl:send 1->2"
  if (const auto colon = name.rfind(':'); colon != std::string_view::npos) name.remove_prefix(colon + 1);
  return detail::readBareOp(detail::lowerAscii(name));
}

inline CollectiveOp canonicalOp(std::string_view name) { return parseOp(name).op; }

// True when a stored name is `op`'s own, with or without its underscores ("all_reduce", "allreduce"), not a
// variant ("all_reduce_coalesced") or another tool's spelling of it.
inline bool namesOp(std::string_view stored, CollectiveOp op) {
  const auto i = static_cast<size_t>(op);
  return i < kCollectiveOpCount && (stored == kCollectiveOpNames[i] || stored == kSqueezedOpNames[i]);
}

// The op a free-form name mentions (a span's name: "ncclAllGather...", "tp all_reduce"), for its colour: the
// coloured ops only, reduce_scatter first, each with or without its underscores, case-insensitive; else Unknown.
inline CollectiveOp opMentionedIn(std::string_view text) {
  const std::string lower = detail::lowerAscii(text);
  for (CollectiveOp op : {CollectiveOp::ReduceScatter, CollectiveOp::AllGather, CollectiveOp::AllReduce,
                          CollectiveOp::Broadcast, CollectiveOp::Barrier, CollectiveOp::AllToAll}) {
    const auto i = static_cast<size_t>(op);
    if (lower.find(kCollectiveOpNames[i]) != std::string::npos || lower.find(kSqueezedOpNames[i]) != std::string::npos)
      return op;
  }
  return CollectiveOp::Unknown;
}

}  // namespace tpscope::vocabulary
