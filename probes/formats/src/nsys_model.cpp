#include "nsys_model.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <set>
#include <tuple>
#include <unordered_map>

#include "kineto_names.h"
#include "nsys_names.h"

namespace tpscope::formats::nsys {

using tracedb::CollectiveRow;
using tracedb::SpanKind;
using tracedb::SpanRow;

namespace {

struct StepRange {
  int64_t begin = 0, end = 0;
  int step = 0;
};

int stepAt(const std::vector<StepRange>& steps, int64_t ts) {
  auto it = std::upper_bound(steps.begin(), steps.end(), ts, [](int64_t t, const StepRange& s) { return t < s.begin; });
  if (it == steps.begin()) return -1;
  --it;
  return ts < it->end ? it->step : -1;
}

// The rows of one process, by index into the file's vectors.
struct ProcessRows {
  std::vector<size_t> gpu, runtime, nvtx;
};

// Which process every row belongs to. GPU rows without globalPid go to the launching runtime call's process (same
// correlation id), else to the file's only process; the rest are counted.
std::map<int64_t, ProcessRows> partition(const NsysFile& f, std::map<std::string, int64_t>& skipped) {
  std::map<int64_t, ProcessRows> out;
  std::unordered_map<int64_t, int64_t> corrProcess;
  for (size_t i = 0; i < f.runtime.size(); ++i) {
    const int64_t key = processKey(f.runtime[i].globalTid);
    out[key].runtime.push_back(i);
    if (f.runtime[i].correlation >= 0) corrProcess.emplace(f.runtime[i].correlation, key);
  }
  for (size_t i = 0; i < f.nvtx.size(); ++i) out[processKey(f.nvtx[i].globalTid)].nvtx.push_back(i);
  for (size_t i = 0; i < f.gpu.size(); ++i) {
    const GpuRow& g = f.gpu[i];
    if (g.process) {
      out[*g.process].gpu.push_back(i);
      continue;
    }
    auto c = g.correlation >= 0 ? corrProcess.find(g.correlation) : corrProcess.end();
    if (c != corrProcess.end()) out[c->second].gpu.push_back(i);
    else if (out.size() <= 1) out[out.empty() ? 0 : out.begin()->first].gpu.push_back(i);
    else skipped["GPU activity of no known process (no globalPid, no launch)"]++;
  }
  return out;
}

// A collective NVTX range and the ranges nested in it on the same thread: one collective call.
struct RangeGroup {
  size_t outer = 0;           // nvtx row index
  int thread = 0;
  std::string op;             // the innermost member's op ("unknown" when only record_param_comms named it)
  size_t inner = 0;           // the innermost member (its time is the call's without GPU work)
  std::vector<size_t> kernels;  // gpu row indexes
};

class ProcessBuilder {
 public:
  ProcessBuilder(const NsysFile& f, int64_t key, const ProcessRows& rows, ProcessModel& m,
                 std::map<std::string, int64_t>& skipped)
      : f_(f), rows_(rows), m_(m), skipped_(skipped) {
    m_.key = key;
    auto pid = f.processPids.find(key);
    m_.pid = pid != f.processPids.end() ? pid->second : pidOf(key);
  }

  void build() {
    assignHostLanes();
    assignGpuLanes();
    findRankHint();
    hostSpans();
    gpuSpans();
    collectives();
    extent();
  }

 private:
  // Host threads: the main thread (tid == pid) first, then by tid; named from ThreadNames.
  void assignHostLanes() {
    std::set<int64_t> tids;
    for (size_t i : rows_.runtime) tids.insert(f_.runtime[i].globalTid);
    for (size_t i : rows_.nvtx)
      if (!f_.nvtx[i].mark) tids.insert(f_.nvtx[i].globalTid);
    std::vector<int64_t> order(tids.begin(), tids.end());
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::tuple(tidOf(a) != m_.pid, tidOf(a), a) < std::tuple(tidOf(b) != m_.pid, tidOf(b), b);
    });
    for (size_t t = 0; t < order.size(); ++t) {
      hostLane_[order[t]] = static_cast<int>(t);
      tracedb::ThreadInfo info;
      info.thread = static_cast<int>(t);
      info.kind = tracedb::thread_kinds::kCpu;
      auto named = f_.threadNames.find(order[t]);
      info.name = named != f_.threadNames.end() ? named->second : "thread " + std::to_string(tidOf(order[t]));
      m_.threads.push_back(std::move(info));
    }
  }

  void assignGpuLanes() {
    std::set<std::pair<int64_t, int64_t>> lanes;
    for (size_t i : rows_.gpu) lanes.insert({f_.gpu[i].device, f_.gpu[i].stream});
    const bool multiDevice = !lanes.empty() && lanes.begin()->first != lanes.rbegin()->first;
    int overflow = 0;
    for (const auto& [device, stream] : lanes) {
      const bool small = device >= 0 && device < 89 && stream >= 0 && stream < kGpuLaneBase;
      const int id = small ? static_cast<int>(kGpuLaneBase * (device + 1) + stream) : kGpuLaneOverflow + overflow++;
      gpuLane_[{device, stream}] = id;
      tracedb::ThreadInfo info;
      info.thread = id;
      info.kind = tracedb::thread_kinds::kCudaStream;
      info.name = (multiDevice ? "gpu " + std::to_string(device) + " " : std::string()) + "stream " +
                  std::to_string(stream);
      m_.threads.push_back(std::move(info));
    }
    m_.info.pid = m_.pid;
    if (!lanes.empty()) {
      const int64_t device = lanes.begin()->first;
      auto cuda = f_.cudaIds.find({m_.pid, device});
      m_.info.device = "cuda:" + std::to_string(cuda != f_.cudaIds.end() ? cuda->second : device);
    }
  }

  void findRankHint() {
    int64_t at = std::numeric_limits<int64_t>::max();
    for (size_t i : rows_.nvtx) {
      const NvtxRow& n = f_.nvtx[i];
      if (n.start >= at) continue;
      if (auto r = rankHint(f_.names[n.bareText])) {
        m_.rankHint = *r;
        at = n.start;
      }
    }
  }

  void addSpan(int thread, SpanKind kind, uint32_t name, int64_t begin, int64_t end, int step, int64_t corr) {
    SpanRow s;
    s.thread = thread;
    s.kind = kind;
    s.name = name;
    s.beginNs = begin;
    s.durNs = end - begin;
    s.step = step;
    if (corr >= 0) s.correlation = corr;
    m_.spans.push_back(s);
  }

  // NVTX ranges (steps, collective calls, the rest compute) and runtime calls (other; synchronisations wait).
  void hostSpans() {
    for (size_t i : rows_.nvtx) {
      const NvtxRow& n = f_.nvtx[i];
      if (n.mark) continue;
      if (auto st = kineto::profilerStep(f_.names[n.bareText])) steps_.push_back(StepRange{n.start, n.end, *st});
    }
    std::sort(steps_.begin(), steps_.end(), [](const StepRange& a, const StepRange& b) { return a.begin < b.begin; });
    int64_t marks = 0;
    for (size_t i : rows_.nvtx) {
      const NvtxRow& n = f_.nvtx[i];
      if (n.mark) {
        ++marks;
        continue;
      }
      const std::string& bare = f_.names[n.bareText];
      const SpanKind kind = kineto::profilerStep(bare)           ? SpanKind::Step
                            : !collectiveOfRange(bare).empty() ? SpanKind::Comm
                                                               : SpanKind::Compute;
      addSpan(hostLane_[n.globalTid], kind, n.text, n.start, n.end, stepAt(steps_, n.start), -1);
    }
    if (marks > 0) skipped_["NVTX marks (read for rank hints only)"] += marks;
    for (size_t i : rows_.runtime) {
      const RuntimeRow& r = f_.runtime[i];
      const bool sync = f_.names[r.name].find("Synchronize") != std::string::npos;
      const int step = stepAt(steps_, r.start);
      addSpan(hostLane_[r.globalTid], sync ? SpanKind::Wait : SpanKind::Other, r.name, r.start, r.end, step,
              r.correlation);
      if (r.correlation >= 0) launch_.emplace(r.correlation, i);
    }
  }

  void gpuSpans() {
    for (size_t i : rows_.gpu) {
      const GpuRow& g = f_.gpu[i];
      SpanKind kind = g.kind == GpuKind::Memcpy ? SpanKind::Memcpy : g.kind == GpuKind::Memset ? SpanKind::Memset
                                                                                                 : SpanKind::Kernel;
      if (g.kind == GpuKind::Kernel && parseNcclKernel(f_.names[g.shortName])) {
        kind = SpanKind::NcclKernel;
        ncclKernels_.push_back(i);
      }
      auto l = g.correlation >= 0 ? launch_.find(g.correlation) : launch_.end();
      const int step = l != launch_.end() ? stepAt(steps_, f_.runtime[l->second].start) : stepAt(steps_, g.start);
      addSpan(gpuLane_[{g.device, g.stream}], kind, g.name, g.start, g.end, step, g.correlation);
    }
    m_.ncclKernels = static_cast<int64_t>(ncclKernels_.size());
  }

  // Collective NVTX ranges grouped per thread: an outermost one and those nested in it.
  std::vector<RangeGroup> rangeGroups() {
    std::vector<size_t> ranges;
    for (size_t i : rows_.nvtx)
      if (!f_.nvtx[i].mark && !collectiveOfRange(f_.names[f_.nvtx[i].bareText]).empty()) ranges.push_back(i);
    std::sort(ranges.begin(), ranges.end(), [&](size_t a, size_t b) {
      const NvtxRow &x = f_.nvtx[a], &y = f_.nvtx[b];
      return std::tuple(hostLane_[x.globalTid], x.start, y.end, a) < std::tuple(hostLane_[y.globalTid], y.start, x.end, b);
    });
    std::vector<RangeGroup> groups;
    for (size_t i : ranges) {
      const NvtxRow& n = f_.nvtx[i];
      const int thread = hostLane_[n.globalTid];
      const std::string op = collectiveOfRange(f_.names[n.bareText]);
      if (!groups.empty() && groups.back().thread == thread && n.start < f_.nvtx[groups.back().outer].end) {
        RangeGroup& g = groups.back();
        if (op != "unknown" || g.op == "unknown") {
          g.op = op;
          g.inner = i;
        }
        continue;
      }
      groups.push_back(RangeGroup{i, thread, op, i, {}});
    }
    return groups;
  }

  CollectiveRow draft(int thread, int64_t enqueue, int64_t start, int64_t end, std::string op, std::string callsite) {
    CollectiveRow c;
    c.op = op.empty() ? "unknown" : std::move(op);
    c.callsite = std::move(callsite);
    c.thread = thread;
    c.enqueueNs = enqueue;
    c.startNs = start;
    c.endNs = end;
    c.step = stepAt(steps_, enqueue);
    c.state = tracedb::CollectiveState::Completed;
    return c;
  }

  // NCCL kernels join the collective NVTX range that encloses their launch (PyTorch's nccl:all_reduce, c10d::,
  // NCCL's own ncclAllReduce); the others are numbered in order on their stream (group nccl-stream-K).
  void collectives() {
    std::vector<RangeGroup> groups = rangeGroups();
    std::map<int, std::vector<size_t>> byThread;  // thread -> group indexes, by begin
    for (size_t k = 0; k < groups.size(); ++k) byThread[groups[k].thread].push_back(k);
    std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> unpaired;  // (device, stream) -> kernels
    for (size_t i : ncclKernels_) {
      const GpuRow& g = f_.gpu[i];
      auto l = g.correlation >= 0 ? launch_.find(g.correlation) : launch_.end();
      int found = -1;
      if (l != launch_.end()) {
        const RuntimeRow& r = f_.runtime[l->second];
        auto t = byThread.find(hostLane_[r.globalTid]);
        if (t != byThread.end()) {
          auto it = std::upper_bound(t->second.begin(), t->second.end(), r.start,
                                     [&](int64_t ts, size_t k) { return ts < f_.nvtx[groups[k].outer].start; });
          if (it != t->second.begin() && r.start < f_.nvtx[groups[*(it - 1)].outer].end) found = static_cast<int>(*(it - 1));
        }
      }
      if (found >= 0) groups[found].kernels.push_back(i);
      else unpaired[{g.device, g.stream}].push_back(i);
    }
    std::vector<CollectiveRow> ranged;
    for (const RangeGroup& g : groups) {
      const NvtxRow& outer = f_.nvtx[g.outer];
      std::string op = g.op;
      if (g.kernels.empty()) {
        if (op == "unknown") {
          skipped_["record_param_comms range without an op or NCCL kernel (not a collective)"]++;
          continue;
        }
        const NvtxRow& inner = f_.nvtx[g.inner];
        ranged.push_back(draft(g.thread, outer.start, inner.start, inner.end, op, f_.names[outer.text]));
        continue;
      }
      int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
      std::string dtype;
      for (size_t i : g.kernels) {
        lo = std::min(lo, f_.gpu[i].start);
        hi = std::max(hi, f_.gpu[i].end);
        auto parsed = parseNcclKernel(f_.names[f_.gpu[i].shortName]);
        if (op == "unknown" && parsed && !parsed->op.empty()) op = parsed->op;
        if (dtype.empty() && parsed) dtype = parsed->dtype;
      }
      CollectiveRow c = draft(g.thread, outer.start, lo, hi, op, f_.names[outer.text]);
      c.dtype = dtype;
      ranged.push_back(std::move(c));
      ++m_.kernelTimed;
      m_.pairedByRange += static_cast<int64_t>(g.kernels.size());
    }
    std::stable_sort(ranged.begin(), ranged.end(), [](const CollectiveRow& a, const CollectiveRow& b) {
      return std::tie(a.enqueueNs, *a.startNs) < std::tie(b.enqueueNs, *b.startNs);
    });
    for (size_t k = 0; k < ranged.size(); ++k) {
      ranged[k].group = "default_pg";
      ranged[k].seq = static_cast<int64_t>(k) + 1;
      m_.collectives.push_back(std::move(ranged[k]));
    }
    streamCollectives(unpaired, !groups.empty());
  }

  void streamCollectives(std::map<std::pair<int64_t, int64_t>, std::vector<size_t>>& unpaired, bool haveRanges) {
    // Streams in order of their first NCCL kernel: the K-th NCCL stream of every rank pairs with the others' K-th.
    std::vector<std::pair<int64_t, std::vector<size_t>*>> streams;
    for (auto& [lane, kernels] : unpaired) {
      std::sort(kernels.begin(), kernels.end(), [&](size_t a, size_t b) {
        return std::tie(f_.gpu[a].start, a) < std::tie(f_.gpu[b].start, b);
      });
      streams.emplace_back(f_.gpu[kernels.front()].start, &kernels);
    }
    std::sort(streams.begin(), streams.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t k = 0; k < streams.size(); ++k) {
      int64_t seq = 0;
      for (size_t i : *streams[k].second) {
        const GpuRow& g = f_.gpu[i];
        auto parsed = parseNcclKernel(f_.names[g.shortName]);
        auto l = g.correlation >= 0 ? launch_.find(g.correlation) : launch_.end();
        const int thread = l != launch_.end() ? hostLane_[f_.runtime[l->second].globalTid] : 0;
        const int64_t enqueue = l != launch_.end() ? std::min(f_.runtime[l->second].start, g.start) : g.start;
        CollectiveRow c = draft(thread, enqueue, g.start, g.end, parsed ? parsed->op : "", f_.names[g.shortName]);
        ++m_.kernelTimed;
        c.dtype = parsed ? parsed->dtype : "";
        c.group = "nccl-stream-" + std::to_string(k);
        c.seq = ++seq;
        m_.collectives.push_back(std::move(c));
      }
      if (haveRanges)
        skipped_["NCCL kernel outside a collective NVTX range (numbered by stream)"] +=
            static_cast<int64_t>(streams[k].second->size());
    }
  }

  void extent() {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (const SpanRow& s : m_.spans) {
      lo = std::min(lo, s.beginNs);
      hi = std::max(hi, s.endNs());
    }
    for (const CollectiveRow& c : m_.collectives) {
      lo = std::min(lo, c.enqueueNs);
      hi = std::max(hi, c.endNs.value_or(c.enqueueNs));
    }
    if (lo > hi) lo = hi = 0;
    m_.minNs = lo;
    m_.maxNs = hi;
    m_.info.startNs = lo;
    m_.info.endNs = hi;
  }

  const NsysFile& f_;
  const ProcessRows& rows_;
  ProcessModel& m_;
  std::map<std::string, int64_t>& skipped_;
  std::unordered_map<int64_t, int> hostLane_;
  std::map<std::pair<int64_t, int64_t>, int> gpuLane_;
  std::vector<StepRange> steps_;
  std::unordered_map<int64_t, size_t> launch_;  // correlation id -> runtime row
  std::vector<size_t> ncclKernels_;
};

}  // namespace

FileModel buildFileModel(const NsysFile& file) {
  FileModel out;
  out.skipped = file.skipped;
  std::map<int64_t, ProcessRows> parts = partition(file, out.skipped);
  for (const auto& [key, rows] : parts) {
    if (rows.gpu.empty() && rows.runtime.empty() && std::none_of(rows.nvtx.begin(), rows.nvtx.end(), [&](size_t i) {
          return !file.nvtx[i].mark;
        }))
      continue;  // a process that only announced itself
    ProcessModel m;
    ProcessBuilder(file, key, rows, m, out.skipped).build();
    // A hint in a mark-only sibling entry of the same process is already in rows.nvtx.
    out.processes.push_back(std::move(m));
  }
  std::stable_sort(out.processes.begin(), out.processes.end(), [](const ProcessModel& a, const ProcessModel& b) {
    return std::tie(a.pid, a.key) < std::tie(b.pid, b.key);
  });
  return out;
}

}  // namespace tpscope::formats::nsys
