#include "kineto_model.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <unordered_map>

#include "kineto_names.h"

namespace tpscope::formats::kineto {

using tracedb::CollectiveRow;
using tracedb::Phase;
using tracedb::Result;
using tracedb::SpanKind;
using tracedb::Status;

namespace {

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool isCollectiveMeta(const CollectiveMeta& m) {
  return !m.name.empty() || m.inNelems >= 0 || m.outNelems >= 0 || !m.pgName.empty();
}

bool isNcclKernelName(std::string_view name) {
  return startsWith(name, "nccl") || startsWith(name, "void nccl") || startsWith(name, "Nccl");
}

struct FlowKey {
  LaneKey lane;
  int64_t ts = 0;
  bool operator==(const FlowKey&) const = default;
};
struct FlowKeyHash {
  size_t operator()(const FlowKey& k) const noexcept {
    uint64_t h = static_cast<uint64_t>(k.ts) * 0x9e3779b97f4a7c15ULL;
    h ^= static_cast<uint64_t>(k.lane.tid) + 0x632be59bd9b4e019ULL + (h << 6) + (h >> 2);
    h ^= static_cast<uint64_t>(k.lane.pid) + 0x85ebca6b0c2d4f13ULL + (h << 6) + (h >> 2);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

struct Group {
  std::vector<int> host;       // host spans, outermost first
  int innermost = -1;          // the deepest host op (nccl:all_reduce inside c10d::allreduce_ ...)
  int innermostDepth = 0;
  std::vector<int> gpu;        // GPU spans linked to it
  std::vector<int> gpuDepth;   // per GPU span: nesting depth, in the group, of the op that launched it
  bool absorbed = false;       // its ops were joined to another group (pairAsyncExecutions)
};

// The collective metadata of a group: its first host op's, else its first GPU span's; nullptr if none has any.
const CollectiveMeta* metaOf(const Group& g, const KinetoFile& file) {
  for (const std::vector<int>* list : {&g.host, &g.gpu})
    for (int i : *list)
      if (const int m = file.spans[i].meta; m >= 0 && isCollectiveMeta(file.metas[m])) return &file.metas[m];
  return nullptr;
}

// The group's op: the metadata's collective name, else the first collective op name; "" if neither names one.
std::string opOf(const Group& g, const CollectiveMeta* meta, const KinetoFile& file) {
  std::string op = meta ? normalizeCollectiveOp(meta->name) : std::string();
  for (const std::vector<int>* list : {&g.host, &g.gpu})
    for (int i : *list)
      if (op.empty() && isCollectiveOpName(file.spans[i].name)) op = normalizeCollectiveOp(file.spans[i].name);
  return op;
}

// Asynchronous backends (Gloo; UCC and MPI alike) run a call on a worker thread: the dispatcher's op on the
// calling thread (c10d::allreduce_, with record_param_comms and its metadata inside) only enqueues the work, and
// the backend's op (gloo:all_reduce) on the worker thread is its execution. Nesting cannot join them, so a group
// with host ops only, none a backend op (an enqueue), and a group whose ops are all backend ops (an execution) are
// paired here into one collective: enqueue = the dispatcher op's begin, start/end = the backend op's, as a flight
// recorder keeps them. Executions are taken in order of begin; each takes the earliest unpaired enqueue that began
// before it with the same op, the same input numel where both are known (metadata "In msg nelems" / the backend
// op's first tensor argument) and the process group its worker thread already served (a backend's worker threads
// serve one process group, whose queue runs in order of enqueueing). Anything left unpaired stays on its own.
void pairAsyncExecutions(std::vector<Group>& groups, const KinetoFile& file, const std::vector<int>& thread) {
  struct Side {
    int group = -1;
    int64_t begin = 0;
    std::string op;
    int64_t numel = -1;
    std::string_view processGroup;
    int thread = 0;
  };
  std::vector<Side> enqueues, executions;
  for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) {
    const Group& g = groups[gi];
    if (g.host.empty() || !g.gpu.empty()) continue;
    bool anyBackend = false, allBackend = true;
    for (int i : g.host) {
      const bool backend = isBackendOpName(file.spans[i].name);
      anyBackend = anyBackend || backend;
      allBackend = allBackend && backend;
    }
    const CollectiveMeta* meta = metaOf(g, file);
    const RawSpan& outer = file.spans[g.host.front()];
    Side side{gi, outer.tsNs, opOf(g, meta, file), -1, meta ? meta->pgName : std::string_view(),
              thread[g.host.front()]};
    if (side.op.empty()) continue;
    if (allBackend) {
      const std::vector<TensorArg> args = tensorArgs(outer.inputDims, outer.inputTypes);
      if (!args.empty()) side.numel = args.front().numel;
      executions.push_back(std::move(side));
    } else if (!anyBackend) {
      if (meta) side.numel = meta->inNelems;
      enqueues.push_back(std::move(side));
    }
  }
  if (enqueues.empty() || executions.empty()) return;
  auto byBegin = [](const Side& a, const Side& b) { return std::tie(a.begin, a.group) < std::tie(b.begin, b.group); };
  std::sort(enqueues.begin(), enqueues.end(), byBegin);
  std::sort(executions.begin(), executions.end(), byBegin);
  std::vector<char> taken(enqueues.size(), 0);
  std::unordered_map<int, std::string_view> serves;  // worker thread -> the process group it executed for
  size_t firstOpen = 0;
  for (const Side& x : executions) {
    while (firstOpen < enqueues.size() && taken[firstOpen]) ++firstOpen;
    for (size_t k = firstOpen; k < enqueues.size() && enqueues[k].begin <= x.begin; ++k) {
      const Side& d = enqueues[k];
      if (taken[k] || d.op != x.op || (d.numel >= 0 && x.numel >= 0 && d.numel != x.numel)) continue;
      auto served = serves.find(x.thread);
      if (served != serves.end() && !d.processGroup.empty() && served->second != d.processGroup) continue;
      if (!d.processGroup.empty()) serves[x.thread] = d.processGroup;
      taken[k] = 1;
      Group& into = groups[d.group];
      Group& from = groups[x.group];
      into.host.insert(into.host.end(), from.host.begin(), from.host.end());
      into.innermost = from.innermost;  // the execution's time is the collective's
      from.absorbed = true;
      break;
    }
  }
}

struct GroupLink {
  int group = -1;
  int depth = 0;  // 1 = launched under the outermost collective op, 2 = under the op nested in it, ...
};

struct StepRange {
  int64_t begin = 0, end = 0;
  int step = 0;
};

int stepAt(const std::vector<StepRange>& steps, int64_t ts) {
  auto it = std::upper_bound(steps.begin(), steps.end(), ts,
                             [](int64_t t, const StepRange& s) { return t < s.begin; });
  if (it == steps.begin()) return -1;
  --it;
  return ts < it->end ? it->step : -1;
}

}  // namespace

std::vector<int> parseRankList(std::string_view text) {
  std::vector<int> out;
  size_t i = 0;
  while (i < text.size()) {
    if ((text[i] >= '0' && text[i] <= '9') || text[i] == '-') {
      int v = 0;
      auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
      if (ec == std::errc()) {
        out.push_back(v);
        i = static_cast<size_t>(p - text.data());
        continue;
      }
    }
    ++i;
  }
  return out;
}

std::vector<TensorArg> tensorArgs(std::string_view dims, std::string_view types) {
  // dims: [[2048, 384], [], [7]]; types: ["float", "Scalar", "c10::Half"]. Both as raw JSON.
  std::vector<TensorArg> out;
  std::vector<std::string> typeList;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != '"') continue;
    std::string t;
    for (++i; i < types.size() && types[i] != '"'; ++i) {
      if (types[i] == '\\' && i + 1 < types.size()) ++i;
      t.push_back(types[i]);
    }
    typeList.push_back(std::move(t));
  }
  int depth = 0;
  size_t arg = 0;
  std::vector<int64_t> shape;
  bool open = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const char c = dims[i];
    if (c == '[') {
      ++depth;
      if (depth == 2) {
        shape.clear();
        open = true;
      }
    } else if (c == ']') {
      if (depth == 2 && open) {
        const std::string dtype = arg < typeList.size() ? normalizeDtype(typeList[arg]) : std::string();
        if (!dtype.empty() && !shape.empty()) {
          int64_t numel = 1;
          for (int64_t d : shape) numel = d > 0 && numel <= std::numeric_limits<int64_t>::max() / d ? numel * d : 0;
          out.push_back(TensorArg{shape, numel, dtype});
        }
        ++arg;
        open = false;
      }
      --depth;
    } else if (depth == 2 && ((c >= '0' && c <= '9') || c == '-')) {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(dims.data() + i, dims.data() + dims.size(), v);
      if (ec == std::errc()) {
        shape.push_back(v);
        i = static_cast<size_t>(p - dims.data()) - 1;
      }
    }
  }
  return out;
}

TensorArg largestTensorArg(std::string_view dims, std::string_view types) {
  TensorArg best;
  for (TensorArg& t : tensorArgs(dims, types))
    if (t.numel > best.numel) best = std::move(t);
  return best;
}

namespace {

// Per span of the file, indexed like KinetoFile::spans: what each pass of buildRankModel decides about it.
struct SpanFacts {
  std::vector<int64_t> corr;  // correlation id, -1 if none
  std::vector<char> gpu;      // on a GPU lane
  std::vector<int> thread;    // lane id (tracedb thread)
  std::vector<SpanKind> kind;
  std::vector<Phase> phase;
  std::vector<int> step;
};

// What the host pass hands the GPU pass and the collective pass.
struct HostLinks {
  std::vector<Group> groups;
  std::unordered_map<int64_t, GroupLink> corrToGroup, extToGroup;
  std::unordered_map<int64_t, int> corrToHost;
  std::vector<StepRange> steps;  // sorted by begin
};

// 1. Correlation ids: from args, else from the ac2g flow event bound to the span (same lane and ts). Kineto writes
// both for runtime and GPU events; the flows matter for traces whose args lack "correlation".
std::vector<int64_t> correlationIds(const KinetoFile& file, int64_t& flowsUsed) {
  const std::vector<RawSpan>& spans = file.spans;
  const int n = static_cast<int>(spans.size());
  std::vector<int64_t> corr(n);
  std::unordered_map<FlowKey, int64_t, FlowKeyHash> flowAt;
  bool needFlows = false;
  for (int i = 0; i < n && !needFlows; ++i)
    needFlows = spans[i].correlation < 0 && (spans[i].cat == Cat::CudaRuntime || spans[i].cat == Cat::Kernel ||
                                             spans[i].cat == Cat::GpuMemcpy || spans[i].cat == Cat::GpuMemset);
  if (needFlows) {
    flowAt.reserve(file.flows.size());
    for (const RawFlow& f : file.flows) flowAt.emplace(FlowKey{f.lane, f.tsNs}, f.id);
  }
  for (int i = 0; i < n; ++i) {
    corr[i] = spans[i].correlation;
    if (corr[i] < 0 && !flowAt.empty()) {
      auto it = flowAt.find(FlowKey{spans[i].lane, spans[i].tsNs});
      if (it != flowAt.end()) {
        ++flowsUsed;
        corr[i] = it->second;
      }
    }
  }
  return corr;
}

// A lane id as text: the number, or the string a string lane (negative id) stands for.
std::string laneText(const KinetoFile& file, int64_t id) {
  if (id >= 0) return std::to_string(id);
  const size_t idx = static_cast<size_t>(-id - 1);
  return idx < file.laneStrings.size() ? file.laneStrings[idx] : std::string();
}

LaneKey gpuLaneKey(const RawSpan& s) {
  return LaneKey{s.device >= 0 ? s.device : s.lane.pid, s.stream >= 0 ? s.stream : s.lane.tid};
}

// 2. Lanes: host threads dense from 0 (main threads first, string lanes last); GPU streams by (device, stream).
// Fills facts.gpu and facts.thread, and m.threads, m.info.pid and m.info.device.
void assignLanes(const KinetoFile& file, int rank, SpanFacts& facts, RankModel& m) {
  const std::vector<RawSpan>& spans = file.spans;
  const int n = static_cast<int>(spans.size());
  facts.gpu.assign(n, 0);
  facts.thread.assign(n, 0);
  std::unordered_map<LaneKey, int, LaneKeyHash> hostLanes;
  std::unordered_map<LaneKey, int, LaneKeyHash> gpuLanes;  // (device, stream)
  std::vector<LaneKey> hostKeys, gpuKeys;
  for (int i = 0; i < n; ++i) {
    const RawSpan& s = spans[i];
    facts.gpu[i] = isGpuCategory(s.cat) || (s.cat == Cat::Other && s.device >= 0 && s.stream >= 0);
    if (facts.gpu[i]) {
      if (gpuLanes.emplace(gpuLaneKey(s), 0).second) gpuKeys.push_back(gpuLaneKey(s));
    } else if (hostLanes.emplace(s.lane, 0).second) {
      hostKeys.push_back(s.lane);
    }
  }
  std::sort(hostKeys.begin(), hostKeys.end(), [](const LaneKey& a, const LaneKey& b) {
    auto key = [](const LaneKey& k) { return std::tuple(k.pid < 0 || k.tid < 0, k.tid != k.pid, k.pid, k.tid); };
    return key(a) < key(b);
  });
  for (size_t t = 0; t < hostKeys.size(); ++t) {
    hostLanes[hostKeys[t]] = static_cast<int>(t);
    tracedb::ThreadInfo info;
    info.rank = rank;
    info.thread = static_cast<int>(t);
    info.kind = tracedb::thread_kinds::kCpu;
    auto named = file.threadNames.find(hostKeys[t]);
    if (named != file.threadNames.end()) info.name = named->second;
    else if (hostKeys[t].tid < 0 && !laneText(file, hostKeys[t].tid).empty())
      info.name = laneText(file, hostKeys[t].tid);
    else if (hostKeys[t].tid < 0) info.name = "lane '" + laneText(file, hostKeys[t].pid) + "'";
    else info.name = "thread " + std::to_string(hostKeys[t].tid);
    m.threads.push_back(std::move(info));
  }
  std::sort(gpuKeys.begin(), gpuKeys.end(),
            [](const LaneKey& a, const LaneKey& b) { return std::pair(a.pid, a.tid) < std::pair(b.pid, b.tid); });
  bool multiDevice = false;
  for (const LaneKey& k : gpuKeys) multiDevice = multiDevice || k.pid != gpuKeys.front().pid;
  int overflow = 0;
  int minDevice = std::numeric_limits<int>::max();
  for (const LaneKey& k : gpuKeys) {
    const bool small = k.pid >= 0 && k.pid < 89 && k.tid >= 0 && k.tid < kGpuLaneBase;
    const int id = small ? static_cast<int>(kGpuLaneBase * (k.pid + 1) + k.tid) : kGpuLaneOverflow + overflow++;
    gpuLanes[k] = id;
    tracedb::ThreadInfo info;
    info.rank = rank;
    info.thread = id;
    info.kind = tracedb::thread_kinds::kCudaStream;
    info.name =
        (multiDevice ? "gpu " + laneText(file, k.pid) + " " : std::string()) + "stream " + laneText(file, k.tid);
    m.threads.push_back(std::move(info));
    if (k.pid >= 0) minDevice = std::min(minDevice, static_cast<int>(k.pid));
  }
  for (int i = 0; i < n; ++i)
    facts.thread[i] = facts.gpu[i] ? gpuLanes[gpuLaneKey(spans[i])] : hostLanes[spans[i].lane];
  for (const LaneKey& k : hostKeys)
    if (k.pid >= 0) {
      m.info.pid = k.pid;
      break;
    }
  const bool anyGpu = !gpuKeys.empty();
  m.info.device = anyGpu && minDevice != std::numeric_limits<int>::max() ? "cuda:" + std::to_string(minDevice) : "cpu";
}

// The kind of a host span that is not a collective op; a ProfilerStep# span also adds its step range.
SpanKind hostSpanKind(const RawSpan& s, std::vector<StepRange>& steps) {
  switch (s.cat) {
    case Cat::CpuOp:
    case Cat::UserAnnotation:
    case Cat::PythonFunction:
      if (auto st = profilerStep(s.name)) {
        steps.push_back(StepRange{s.tsNs, s.tsNs + s.durNs, *st});
        return SpanKind::Step;
      }
      if (startsWith(s.name, "Optimizer.")) return SpanKind::Optimizer;
      if (startsWith(s.name, "enumerate(DataLoader)")) return SpanKind::Data;
      return SpanKind::Compute;
    case Cat::CudaRuntime:
    case Cat::CudaDriver:
      return s.name.find("Synchronize") != std::string_view::npos ? SpanKind::Wait : SpanKind::Other;
    default: return SpanKind::Other;
  }
}

// 3. Host spans: nesting per lane gives phases, collective groups (an outermost collective op and the collective
// ops inside it) and the correlation ids launched from inside a collective. Fills facts.kind/phase/step for host
// spans.
HostLinks walkHostSpans(const KinetoFile& file, SpanFacts& facts) {
  const std::vector<RawSpan>& spans = file.spans;
  const int n = static_cast<int>(spans.size());
  const std::vector<int>& thread = facts.thread;
  HostLinks links;
  std::vector<int> order;
  order.reserve(n);
  for (int i = 0; i < n; ++i)
    if (!facts.gpu[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (thread[a] != thread[b]) return thread[a] < thread[b];
    if (spans[a].tsNs != spans[b].tsNs) return spans[a].tsNs < spans[b].tsNs;
    if (spans[a].durNs != spans[b].durNs) return spans[a].durNs > spans[b].durNs;
    return a < b;
  });
  std::vector<int> ctx(n, -1);      // group of the nearest collective op at or above the span
  std::vector<int> ctxDepth(n, 0);  // how many of that group's ops are at or above the span
  std::vector<int> stack;
  int lane = -1;
  for (int i : order) {
    const RawSpan& s = spans[i];
    if (thread[i] != lane) {
      stack.clear();
      lane = thread[i];
    }
    while (!stack.empty() && spans[stack.back()].tsNs + spans[stack.back()].durNs <= s.tsNs) stack.pop_back();
    const int parent = stack.empty() ? -1 : stack.back();

    if (startsWith(s.name, "autograd::engine::evaluate_function")) facts.phase[i] = Phase::Backward;
    else if (startsWith(s.name, "Optimizer.")) facts.phase[i] = Phase::Optimizer;
    else if (parent >= 0) facts.phase[i] = facts.phase[parent];

    const CollectiveMeta* meta = s.meta >= 0 ? &file.metas[s.meta] : nullptr;
    const bool hasCollMeta = meta && isCollectiveMeta(*meta);
    const bool notCollective = hasCollMeta && isNonCollectiveCommName(meta->name);
    const bool collectiveOp = !notCollective && (hasCollMeta || isCollectiveOpName(s.name));
    ctx[i] = parent >= 0 ? ctx[parent] : -1;
    ctxDepth[i] = parent >= 0 ? ctxDepth[parent] : 0;
    if (collectiveOp) {
      if (ctx[i] < 0) {
        ctx[i] = static_cast<int>(links.groups.size());
        links.groups.emplace_back();
      }
      ++ctxDepth[i];
      Group& group = links.groups[ctx[i]];
      group.host.push_back(i);
      if (ctxDepth[i] > group.innermostDepth) {
        group.innermost = i;
        group.innermostDepth = ctxDepth[i];
      }
      if (s.externalId >= 0) links.extToGroup[s.externalId] = GroupLink{ctx[i], ctxDepth[i]};
    }
    if (facts.corr[i] >= 0) {
      links.corrToHost[facts.corr[i]] = i;
      if (ctx[i] >= 0) links.corrToGroup[facts.corr[i]] = GroupLink{ctx[i], ctxDepth[i]};
    }

    if (notCollective) facts.kind[i] = SpanKind::Wait;
    else if (collectiveOp) facts.kind[i] = SpanKind::Comm;
    else facts.kind[i] = hostSpanKind(s, links.steps);
    stack.push_back(i);
  }
  std::sort(links.steps.begin(), links.steps.end(),
            [](const StepRange& a, const StepRange& b) { return a.begin < b.begin; });
  for (int i : order) facts.step[i] = stepAt(links.steps, spans[i].tsNs);
  return links;
}

// 4. GPU spans: linked to their host op through the correlation id (or External id), kinds, steps.
void linkGpuSpans(const KinetoFile& file, SpanFacts& facts, HostLinks& links) {
  const std::vector<RawSpan>& spans = file.spans;
  const int n = static_cast<int>(spans.size());
  for (int i = 0; i < n; ++i) {
    if (!facts.gpu[i]) continue;
    const RawSpan& s = spans[i];
    const int64_t corr = facts.corr[i];
    const CollectiveMeta* meta = s.meta >= 0 ? &file.metas[s.meta] : nullptr;
    const bool hasCollMeta = meta && isCollectiveMeta(*meta) && !isNonCollectiveCommName(meta->name);
    GroupLink link;
    if (corr >= 0) {
      auto it = links.corrToGroup.find(corr);
      if (it != links.corrToGroup.end()) link = it->second;
    }
    if (link.group < 0 && (corr < 0 || hasCollMeta) && s.externalId >= 0) {
      auto it = links.extToGroup.find(s.externalId);
      if (it != links.extToGroup.end()) link = it->second;
    }
    if (link.group < 0 && hasCollMeta) {  // the host side is missing: the kernel's metadata still identifies it
      link.group = static_cast<int>(links.groups.size());
      links.groups.emplace_back();
    }
    const int g = link.group;
    if (g >= 0) {
      links.groups[g].gpu.push_back(i);
      links.groups[g].gpuDepth.push_back(link.depth);
    }
    switch (s.cat) {
      case Cat::Kernel:
        facts.kind[i] = g >= 0 || hasCollMeta || isNcclKernelName(s.name) ? SpanKind::NcclKernel : SpanKind::Kernel;
        break;
      case Cat::GpuMemcpy: facts.kind[i] = SpanKind::Memcpy; break;
      case Cat::GpuMemset: facts.kind[i] = SpanKind::Memset; break;
      default: facts.kind[i] = SpanKind::Other;
    }
    auto host = corr >= 0 ? links.corrToHost.find(corr) : links.corrToHost.end();
    if (host != links.corrToHost.end()) {
      facts.step[i] = facts.step[host->second];
      facts.phase[i] = facts.phase[host->second];
    } else {
      facts.step[i] = stepAt(links.steps, s.tsNs);
    }
  }
}

// The input tensor of a group (the schema's shape, numel and bytes are the input's): the first tensor argument of
// the backend's op (nccl:_all_gather_base records only its input), else the largest tensor argument of any op
// (c10d::_allgather_base_ records output and input).
TensorArg inputTensorOf(const Group& g, const std::vector<RawSpan>& spans) {
  TensorArg tensor;
  for (int i : g.host) {
    if (tensor.numel >= 0 || spans[i].name.find(':') == std::string_view::npos || startsWith(spans[i].name, "c10d::"))
      continue;
    std::vector<TensorArg> args = tensorArgs(spans[i].inputDims, spans[i].inputTypes);
    if (!args.empty()) tensor = std::move(args.front());
  }
  for (int i : g.host) {
    if (tensor.numel >= 0) break;
    TensorArg t = largestTensorArg(spans[i].inputDims, spans[i].inputTypes);
    if (t.numel > tensor.numel) tensor = std::move(t);
  }
  return tensor;
}

// Times of a group's collective (absolute, ns) and the span it is attributed to (thread, step, phase, callsite).
// GPU time: the kernels launched by the innermost collective op that launched any (c10d::allreduce_ may launch a
// copy kernel before nccl:all_reduce launches the NCCL kernel; the collective is the latter).
// Returns whether a kernel timed it.
bool timeCollective(const Group& g, const KinetoFile& file, const SpanFacts& facts, CollectiveRow& c) {
  const std::vector<RawSpan>& spans = file.spans;
  const int64_t base = file.baseTimeNs.value_or(0);
  int64_t kernelBegin = std::numeric_limits<int64_t>::max(), kernelEnd = std::numeric_limits<int64_t>::min();
  int64_t gpuBegin = kernelBegin, gpuEnd = kernelEnd;
  int kernelDepth = 0;
  for (size_t k = 0; k < g.gpu.size(); ++k)
    if (spans[g.gpu[k]].cat == Cat::Kernel) kernelDepth = std::max(kernelDepth, g.gpuDepth[k]);
  for (size_t k = 0; k < g.gpu.size(); ++k) {
    const int i = g.gpu[k];
    if (spans[i].cat == Cat::Kernel && g.gpuDepth[k] < kernelDepth) continue;
    const int64_t b = spans[i].tsNs, e = spans[i].tsNs + spans[i].durNs;
    gpuBegin = std::min(gpuBegin, b);
    gpuEnd = std::max(gpuEnd, e);
    if (spans[i].cat == Cat::Kernel) {
      kernelBegin = std::min(kernelBegin, b);
      kernelEnd = std::max(kernelEnd, e);
    }
  }
  const bool haveKernel = kernelEnd != std::numeric_limits<int64_t>::min();
  const bool haveGpu = gpuEnd != std::numeric_limits<int64_t>::min();
  const int at = g.host.empty() ? g.gpu.front() : g.host.front();
  c.thread = facts.thread[at];
  c.step = facts.step[at];
  c.phase = facts.phase[at];
  c.callsite = std::string(spans[at].name);
  if (!g.host.empty()) {
    c.enqueueNs = spans[at].tsNs + base;
    // Without GPU activity (Gloo, CPU traces) the collective runs for the innermost op's time.
    const RawSpan& inner = spans[g.innermost >= 0 ? g.innermost : at];
    c.startNs = (haveKernel ? kernelBegin : haveGpu ? gpuBegin : inner.tsNs) + base;
    c.endNs = (haveKernel ? kernelEnd : haveGpu ? gpuEnd : inner.tsNs + inner.durNs) + base;
  } else {
    c.enqueueNs = (haveKernel ? kernelBegin : gpuBegin) + base;
    c.startNs = c.enqueueNs;
    c.endNs = (haveKernel ? kernelEnd : gpuEnd) + base;
  }
  return haveKernel;
}

struct Draft {
  CollectiveRow row;
  int64_t metaSeq = -1;
};

// The collective of one group, or nullopt (counted in m.skipped) when nothing names it a collective.
std::optional<Draft> draftCollective(const Group& g, const KinetoFile& file, int rank, const SpanFacts& facts,
                                     std::map<std::string, tracedb::GroupInfo>& groupInfos, RankModel& m) {
  const CollectiveMeta* meta = metaOf(g, file);
  std::string op = opOf(g, meta, file);
  if (op.empty() && !meta) {
    // Only record_param_comms without metadata: PyTorch also emits it around waits and barriers it does not
    // name; without metadata or an op name it cannot be told apart, so it stays a Comm span only.
    m.skipped["record_param_comms without metadata or op name (not a collective)"]++;
    return std::nullopt;
  }
  if (op.empty()) op = meta && !meta->name.empty() ? std::string(meta->name) : "unknown";

  const TensorArg tensor = inputTensorOf(g, file.spans);
  Draft d;
  CollectiveRow& c = d.row;
  c.rank = rank;
  c.op = std::move(op);
  c.dtype = meta && !meta->dtype.empty() ? normalizeDtype(meta->dtype) : tensor.dtype;
  if (c.dtype.empty() && meta && !meta->dtype.empty()) c.dtype = std::string(meta->dtype);
  if (meta && (meta->inNelems >= 0 || meta->outNelems >= 0)) {
    c.numel = meta->inNelems >= 0 ? meta->inNelems : meta->outNelems;
    if (tensor.numel == c.numel) c.shape = tensor.shape;
    else if (c.numel > 0) c.shape = {c.numel};
  } else if (tensor.numel >= 0) {
    c.numel = tensor.numel;
    c.shape = tensor.shape;
  }
  c.bytes = c.numel * dtypeSize(c.dtype);
  c.group = meta && !meta->pgName.empty() ? std::string(meta->pgName) : "default_pg";
  if (meta && !meta->pgName.empty() && !groupInfos.count(c.group)) {
    tracedb::GroupInfo gi;
    gi.name = c.group;
    gi.ranks = parseRankList(meta->pgRanks);
    gi.backend = file.backend;
    groupInfos[c.group] = std::move(gi);
  }
  d.metaSeq = meta ? meta->seq : -1;
  if (timeCollective(g, file, facts, c)) ++m.kernelTimed;
  c.state = tracedb::CollectiveState::Completed;
  return d;
}

// Sequence numbers per group: the metadata's when every collective of the group has a distinct one, else the
// order of enqueueing on this rank, 1-based like c10d's (1, 2, ...). A group no metadata described gets the
// default group's ranks (or 0..world-1).
void numberCollectives(std::vector<Draft>& drafts, const KinetoFile& file, int rank,
                       std::map<std::string, tracedb::GroupInfo>& groupInfos, RankModel& m) {
  std::stable_sort(drafts.begin(), drafts.end(), [](const Draft& a, const Draft& b) {
    return std::tie(a.row.group, a.row.enqueueNs, *a.row.startNs) < std::tie(b.row.group, b.row.enqueueNs, *b.row.startNs);
  });
  for (size_t begin = 0; begin < drafts.size();) {
    size_t end = begin;
    while (end < drafts.size() && drafts[end].row.group == drafts[begin].row.group) ++end;
    std::vector<int64_t> seqs;
    bool allMeta = true;
    for (size_t k = begin; k < end; ++k) {
      allMeta = allMeta && drafts[k].metaSeq >= 0;
      seqs.push_back(drafts[k].metaSeq);
    }
    std::sort(seqs.begin(), seqs.end());
    const bool distinct = std::adjacent_find(seqs.begin(), seqs.end()) == seqs.end();
    const bool anyMeta = !seqs.empty() && seqs.back() >= 0;
    if (anyMeta && !(allMeta && distinct))
      m.skipped["collective Seq missing or repeated in its group (numbered by order instead)"] +=
          static_cast<int64_t>(end - begin);
    for (size_t k = begin; k < end; ++k)
      drafts[k].row.seq = allMeta && distinct ? drafts[k].metaSeq : static_cast<int64_t>(k - begin) + 1;
    if (!(allMeta && distinct)) m.seqByOrder.insert(drafts[begin].row.group);
    if (!groupInfos.count(drafts[begin].row.group)) {
      tracedb::GroupInfo gi;
      gi.name = drafts[begin].row.group;
      for (const PgConfig& pg : file.pgConfig)
        if (pg.desc == "default_pg") gi.ranks = pg.ranks;
      if (gi.ranks.empty()) {
        const int world = file.worldSize.value_or(rank + 1);
        for (int r = 0; r < world; ++r) gi.ranks.push_back(r);
      }
      gi.backend = file.backend;
      groupInfos[gi.name] = std::move(gi);
    }
    begin = end;
  }
}

// 5. Collectives: one per group. Fills m.collectives and m.groups.
void buildCollectives(const KinetoFile& file, int rank, const SpanFacts& facts, HostLinks& links, RankModel& m) {
  std::map<std::string, tracedb::GroupInfo> groupInfos;
  for (const PgConfig& pg : file.pgConfig) {
    tracedb::GroupInfo gi;
    gi.name = pg.name;
    gi.ranks = pg.ranks;
    gi.backend = backendFromConfig(pg.backend);
    if (gi.backend.empty()) gi.backend = file.backend;
    groupInfos[pg.name] = std::move(gi);
  }
  std::vector<Draft> drafts;
  pairAsyncExecutions(links.groups, file, facts.thread);
  for (const Group& g : links.groups) {
    if (g.absorbed) continue;
    if (std::optional<Draft> d = draftCollective(g, file, rank, facts, groupInfos, m)) drafts.push_back(std::move(*d));
  }
  numberCollectives(drafts, file, rank, groupInfos, m);
  m.collectives.reserve(drafts.size());
  for (Draft& d : drafts) m.collectives.push_back(std::move(d.row));
  for (auto& [name, gi] : groupInfos) m.groups.push_back(std::move(gi));
}

// 6. Spans, with names interned once per distinct string; counters; the rank's time range over everything.
Status emitRows(const KinetoFile& file, int rank, const SpanFacts& facts, const InternFn& intern, RankModel& m) {
  const std::vector<RawSpan>& spans = file.spans;
  const int n = static_cast<int>(spans.size());
  const int64_t base = file.baseTimeNs.value_or(0);
  std::unordered_map<std::string_view, uint32_t> names;
  m.spans.reserve(n);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int i = 0; i < n; ++i) {
    const RawSpan& s = spans[i];
    auto it = names.find(s.name);
    if (it == names.end()) {
      auto id = intern(s.name);
      if (!id) return id.status();
      it = names.emplace(s.name, *id).first;
    }
    tracedb::SpanRow row;
    row.rank = rank;
    row.thread = facts.thread[i];
    row.kind = facts.kind[i];
    row.name = it->second;
    row.beginNs = s.tsNs + base;
    row.durNs = s.durNs;
    row.step = facts.step[i];
    row.phase = facts.phase[i];
    if (facts.corr[i] >= 0) row.correlation = facts.corr[i];
    lo = std::min(lo, row.beginNs);
    hi = std::max(hi, row.beginNs + row.durNs);
    m.spans.push_back(row);
  }
  for (const RawCounter& rc : file.counters) {
    tracedb::CounterRow c;
    c.rank = rank;
    c.name = rc.name;
    c.tsNs = rc.tsNs + base;
    c.value = rc.value;
    lo = std::min(lo, c.tsNs);
    hi = std::max(hi, c.tsNs);
    m.counters.push_back(std::move(c));
  }
  for (const CollectiveRow& c : m.collectives) {
    lo = std::min(lo, c.enqueueNs);
    hi = std::max(hi, c.endNs.value_or(c.enqueueNs));
  }
  if (lo > hi) lo = hi = base;
  m.minNs = lo;
  m.maxNs = hi;
  return Status::ok();
}

}  // namespace

Result<RankModel> buildRankModel(const KinetoFile& file, int rank, const InternFn& intern) {
  RankModel m;
  m.rank = rank;
  m.skipped = file.skipped;
  const size_t n = file.spans.size();
  SpanFacts facts;
  facts.corr = correlationIds(file, m.flowsUsed);
  assignLanes(file, rank, facts, m);
  facts.kind.assign(n, SpanKind::Other);
  facts.phase.assign(n, Phase::None);
  facts.step.assign(n, -1);
  HostLinks links = walkHostSpans(file, facts);
  linkGpuSpans(file, facts, links);
  buildCollectives(file, rank, facts, links, m);
  if (Status st = emitRows(file, rank, facts, intern, m); !st) return st;

  tracedb::RankInfo& info = m.info;
  info.rank = rank;
  info.worldSize = file.worldSize.value_or(1);
  info.startNs = m.minNs;
  info.endNs = m.maxNs;
  return m;
}

}  // namespace tpscope::formats::kineto
