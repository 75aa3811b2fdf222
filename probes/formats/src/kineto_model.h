// Interpretation of one parsed Kineto file as one rank of a tpscope run: lanes, span kinds, steps and phases,
// collectives (from metadata or the profiler's collective op names), GPU-host correlation. Times stay absolute
// (file base + ts, ns); the importer shifts them to the run's epoch when writing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kineto_parse.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::formats::kineto {

// Interns a span name in the output file; returns its id in the strings table.
using InternFn = std::function<tracedb::Result<uint32_t>(std::string_view)>;

// Thread ids of GPU lanes: kGpuLaneBase * (device + 1) + stream while both are small, else kGpuLaneOverflow + n.
inline constexpr int kGpuLaneBase = 10000;
inline constexpr int kGpuLaneOverflow = 900000;

struct RankModel {
  int rank = 0;
  tracedb::RankInfo info;  // startNs/endNs absolute
  std::vector<tracedb::ThreadInfo> threads;
  std::vector<tracedb::SpanRow> spans;              // beginNs absolute
  std::vector<tracedb::CollectiveRow> collectives;  // times absolute
  std::vector<tracedb::CounterRow> counters;        // tsNs absolute
  std::vector<tracedb::GroupInfo> groups;
  int64_t minNs = 0, maxNs = 0;  // absolute, over everything above
  int64_t flowsUsed = 0;  // ac2g flow events that gave a span its missing correlation id
  std::map<std::string, int64_t> skipped;
  std::set<std::string> seqByOrder;  // groups whose seq is the order of enqueueing (no distinct Seq in the trace)
  int64_t kernelTimed = 0;           // collectives whose times came from their NCCL kernel (meta collective_arrival)
};

// Builds the rank model of `file`, whose rank has been decided by the caller.
tracedb::Result<RankModel> buildRankModel(const KinetoFile& file, int rank, const InternFn& intern);

// Parses "[0, 1, 2]" (a Process Group Ranks value); skips anything that is not an integer.
std::vector<int> parseRankList(std::string_view text);

// The tensor arguments of an op from its raw "Input Dims" and "Input type" arrays (record_shapes), in order:
// shape, numel and dtype (normalised); arguments that are not tensors (Scalar, "", TensorList) are left out.
struct TensorArg {
  std::vector<int64_t> shape;
  int64_t numel = -1;
  std::string dtype;
};
std::vector<TensorArg> tensorArgs(std::string_view inputDims, std::string_view inputTypes);
// The largest of them; numel = -1 if there is none.
TensorArg largestTensorArg(std::string_view inputDims, std::string_view inputTypes);

}  // namespace tpscope::formats::kineto
