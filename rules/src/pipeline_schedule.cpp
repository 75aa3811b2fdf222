#include "tpscope/rules/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "tpscope/rules/config.h"

namespace tpscope::rules {

PipelineSchedule parsePipelineSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  if (name == "interleaved") return PipelineSchedule::Interleaved;
  throw ConfigError(fmt::format("schedule \"{}\" must be gpipe, 1f1b or interleaved", name));
}

const char* pipelineScheduleName(PipelineSchedule s) noexcept {
  switch (s) {
    case PipelineSchedule::GPipe: return "gpipe";
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::Interleaved: return "interleaved";
  }
  return "1f1b";
}

namespace {

struct Pass {
  bool forward;
  int microbatch, chunk;
};

// The (micro-batch, chunk) order of one stage, without the communication.
std::vector<Pass> stageOrder(PipelineSchedule kind, int p, int s, int m, int v) {
  std::vector<Pass> out;
  if (kind == PipelineSchedule::GPipe) {
    for (int i = 0; i < m; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < m; ++i) out.push_back({false, i, 0});
    return out;
  }
  if (kind == PipelineSchedule::OneFOneB) v = 1;
  const int total = m * v;
  auto mbOf = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto chunkOf = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  int warmup = kind == PipelineSchedule::OneFOneB ? p - s - 1 : (p - s - 1) * 2 + (v - 1) * p;
  if (kind == PipelineSchedule::Interleaved && m == p) warmup = total;
  warmup = std::min(warmup, total);
  for (int k = 0; k < warmup; ++k) out.push_back({true, mbOf(k), chunkOf(k, true)});
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back({true, mbOf(warmup + k), chunkOf(warmup + k, true)});
    out.push_back({false, mbOf(k), chunkOf(k, false)});
  }
  for (int k = total - warmup; k < total; ++k) out.push_back({false, mbOf(k), chunkOf(k, false)});
  return out;
}

}  // namespace

std::vector<std::vector<PipelineOp>> buildPipelineSchedule(PipelineSchedule kind, int p, int m, int v) {
  if (p < 1 || m < 1 || v < 1) throw std::invalid_argument("pipeline schedule: stages, micro-batches, chunks >= 1");
  if (kind != PipelineSchedule::Interleaved) v = 1;
  if (kind == PipelineSchedule::Interleaved && m % p != 0)
    throw std::invalid_argument("interleaved schedule: micro-batches must be divisible by the stages");
  const int vstages = p * v;
  std::vector<std::vector<PipelineOp>> out(static_cast<size_t>(p));
  // Message identity (forward?, micro-batch, sending virtual stage) -> its sequence number on its pair.
  std::map<std::tuple<bool, int, int>, uint64_t> seqOf;
  std::map<std::pair<int, int>, uint64_t> pairCount;
  for (int s = 0; s < p; ++s) {
    for (const Pass& ps : stageOrder(kind, p, s, m, v)) {
      PipelineOp op;
      op.forward = ps.forward;
      op.microbatch = ps.microbatch;
      op.chunk = ps.chunk;
      const int vs = ps.chunk * p + s;
      const int next = ps.forward ? vs + 1 : vs - 1;
      if (next >= 0 && next < vstages) {
        op.sendTo = next % p;
        op.sendSeq = ++pairCount[{s, op.sendTo}];
        seqOf[{ps.forward, ps.microbatch, vs}] = op.sendSeq;
      }
      out[static_cast<size_t>(s)].push_back(op);
    }
  }
  for (int s = 0; s < p; ++s) {
    for (PipelineOp& op : out[static_cast<size_t>(s)]) {
      const int vs = op.chunk * p + s;
      const int prev = op.forward ? vs - 1 : vs + 1;
      if (prev < 0 || prev >= vstages) continue;
      op.recvFrom = prev % p;
      op.recvSeq = seqOf.at({op.forward, op.microbatch, prev});
    }
  }
  return out;
}

double analyticBubbleFraction(PipelineSchedule kind, int p, int m, int v) {
  if (kind != PipelineSchedule::Interleaved) v = 1;
  return static_cast<double>(p - 1) / (static_cast<double>(v) * m + p - 1);
}

std::vector<std::vector<SimulatedOp>> simulatePipeline(const std::vector<std::vector<PipelineOp>>& schedule,
                                                       const std::vector<double>& fwd,
                                                       const std::vector<double>& bwd) {
  const int p = static_cast<int>(schedule.size());
  std::vector<std::vector<SimulatedOp>> out(schedule.size());
  std::vector<size_t> next(schedule.size(), 0);
  std::vector<double> free(schedule.size(), 0.0);
  std::map<std::tuple<int, int, uint64_t>, double> arrived;  // (src, dst, seq) -> when it was sent
  size_t left = 0;
  for (const auto& ops : schedule) left += ops.size();
  while (left > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      const auto& ops = schedule[static_cast<size_t>(s)];
      while (next[s] < ops.size()) {
        const PipelineOp& op = ops[next[s]];
        double ready = free[s];
        if (op.recvFrom >= 0) {
          auto it = arrived.find({op.recvFrom, s, op.recvSeq});
          if (it == arrived.end()) break;  // blocked on a receive
          ready = std::max(ready, it->second);
        }
        const size_t vs = static_cast<size_t>(op.chunk * p + s);
        const double dur = op.forward ? fwd.at(vs) : bwd.at(vs);
        out[s].push_back({ready, ready + dur});
        free[s] = ready + dur;
        if (op.sendTo >= 0) arrived[{s, op.sendTo, op.sendSeq}] = free[s];
        ++next[s];
        --left;
        progressed = true;
      }
    }
    if (!progressed) throw std::logic_error("pipeline schedule deadlocks: every stage waits on a receive");
  }
  return out;
}

}  // namespace tpscope::rules
