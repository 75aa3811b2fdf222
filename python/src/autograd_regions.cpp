// tpscope._autograd: the backward span of every module call, found and timed in C++ on LibTorch's autograd graph.
//
// The same algorithm as tpscope/_modules.py's Python walk (its docstring has the full story), moved out of Python
// because it runs for every module call and every autograd node: a span ends when the last node of the module's own
// region has run (post-hooks on the region's sinks); a submodule's region is walked once, by the submodule, and its
// parent waits for its span instead of its nodes. Here the walk touches Node objects directly and the hooks are C++
// FunctionPreHook/FunctionPostHook: autograd runs them without the GIL and without a Python call — cheap enough to
// put a pre-hook on every node of a region, so a span begins when the first of its nodes (or of its submodules')
// runs, even where an in-place op on an output view replaced the output's node (the Python walk, which hooks the
// output's node only, then starts the span at its first sink).
//
// Built against the PyTorch of the interpreter the package is for (its headers, libtorch_python) and imported only
// when that same PyTorch is the one loaded (tpscope/_modules.py checks the version first); otherwise the Python walk
// runs. Spans go to the one recorder in tpscope._native through span_api.h.
//
// Threading: forward_done/end_root_call/current/backward_finished are called with the GIL; the hooks run on autograd's
// threads without it. One mutex guards the state; the hooks never take the GIL, so no lock order can deadlock.
#include "autograd_regions.h"

#include <c10/core/GradMode.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "span_api.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;
// How autograd owns its nodes: std::shared_ptr in earlier 2.x, c10::intrusive_ptr in 2.15.
using NodePtr = decltype(torch::autograd::Edge::function);

namespace {

// A strong reference to a node autograd already owns (a template, so that only the branch of this PyTorch compiles).
// N is a parameter too, so that the discarded branch's call stays dependent and is never looked up.
template <typename Ptr = NodePtr, typename N = Node>
Ptr strongRef(N* node) {
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<Node>>)
    return node->shared_from_this();
  else
    return Ptr::reclaim_copy(node);
}

const tpscope::python::SpanApi* api = nullptr;

// One module call's backward span.
struct Region : std::enable_shared_from_this<Region> {
  int info = -1;             // the ModuleInfo's number on the Python side (current() answers it)
  const void* site = nullptr;
  int layer = -1;
  int64_t index = 0;         // the call's order among module calls: outer calls have smaller ones
  uint64_t t0 = 0, t1 = 0;
  int pending = 0;           // own hooked nodes + child spans not finished
  bool done = false;
  std::shared_ptr<Region> parent;
  std::vector<NodePtr> frontier;  // nodes just outside the region (only while its root call runs)
};
using RegionPtr = std::shared_ptr<Region>;

constexpr size_t kOpenLimit = 1 << 16;

struct Tables {
  std::mutex mu;
  // During one root call (the outermost module's forward):
  std::unordered_map<Node*, Region*> claims;   // node -> the innermost region owning it
  std::vector<NodePtr> claimed;  // keeps claimed nodes alive: an address is never reused
  std::vector<RegionPtr> rootRegions;
  // Since the last backward() returned:
  std::vector<RegionPtr> open;
  std::vector<RegionPtr> running;  // begun, not ended; innermost last
};
// Never destroyed, on purpose: a forward that raised leaves its walk's nodes here until the next root call, and
// destroying autograd nodes (some hold Python objects) after the interpreter has finalised must not be what an exit
// does.
Tables& tables = *new Tables;
std::mutex& mu = tables.mu;
auto& claims = tables.claims;
auto& claimed = tables.claimed;
auto& rootRegions = tables.rootRegions;
auto& open = tables.open;
auto& running = tables.running;

// Ends `r` and, when it was the last thing its parents waited for, them too. Holds mu.
void finish(Region* r) {
  while (r != nullptr && !r->done) {
    r->done = true;
    if (r->t0 != 0) {
      api->emitSpan(r->site, r->t0, std::max(r->t1, r->t0), r->layer);
      auto it = std::find_if(running.begin(), running.end(), [r](const RegionPtr& p) { return p.get() == r; });
      if (it != running.end()) running.erase(it);
    }
    Region* parent = r->parent.get();
    if (parent == nullptr) return;
    parent->t1 = std::max(parent->t1, r->t1);
    if (--parent->pending > 0) return;
    r = parent;
  }
}

// Starts `r`, and the regions around it that have not started (outer first: the innermost ends up on top). Holds mu.
void start(Region* r, uint64_t t) {
  Region* chain[64];
  int n = 0;
  for (; r != nullptr && r->t0 == 0 && n < 64; r = r->parent.get()) chain[n++] = r;
  while (n > 0) {
    Region* s = chain[--n];
    s->t0 = t;
    running.push_back(s->shared_from_this());
  }
}

// On every node of a region: the span begins when the first of them runs — normally the node of the module's output,
// but not when an in-place op on an output view replaced that node (nn.ReLU(inplace=True) after a Linear).
struct StartHook final : torch::autograd::FunctionPreHook {
  explicit StartHook(RegionPtr r) : region(std::move(r)) {}
  variable_list operator()(const variable_list& grads) override {
    const uint64_t t = api->ticks();
    std::lock_guard<std::mutex> lock(mu);
    start(region.get(), t);
    return grads;
  }
  RegionPtr region;
};

struct SinkHook final : torch::autograd::FunctionPostHook {
  explicit SinkHook(RegionPtr r) : region(std::move(r)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    const uint64_t t = api->ticks();
    std::lock_guard<std::mutex> lock(mu);
    region->t1 = t;
    if (--region->pending == 0) finish(region.get());
    return outputs;
  }
  RegionPtr region;
};

bool isAccumulateGrad(const Node* n) { return dynamic_cast<const torch::autograd::AccumulateGrad*>(n) != nullptr; }

bool contains(const std::vector<Node*>& v, const Node* n) { return std::find(v.begin(), v.end(), n) != v.end(); }

// The grad_fn of each tensor in a tuple of tensors (others are skipped); null ones dropped.
std::vector<NodePtr> gradFns(const std::vector<py::handle>& tensors) {
  std::vector<NodePtr> out;
  out.reserve(tensors.size());
  for (py::handle h : tensors) {
    if (!THPVariable_Check(h.ptr())) continue;
    NodePtr fn = THPVariable_Unpack(h.ptr()).grad_fn();
    if (fn) out.push_back(std::move(fn));
  }
  return out;
}

// The tensors in a module call's inputs or output, as _modules._tensors finds them: a tensor (a subclass too), or the
// tensors in tuples, lists and dicts nested at most 3 deep. Borrowed: the call's arguments hold them.
void flatten(py::handle x, int depth, std::vector<py::handle>& out) {
  PyObject* o = x.ptr();
  if (THPVariable_Check(o)) {
    out.push_back(x);
  } else if (depth < 3 && (PyTuple_Check(o) || PyList_Check(o))) {
    for (py::handle item : x) flatten(item, depth + 1, out);
  } else if (depth < 3 && PyDict_Check(o)) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &key, &value)) flatten(value, depth + 1, out);
  }
}

// Claims the module call's own nodes, from its output nodes back to its inputs' nodes, earlier regions and leaves;
// hooks each of them (its span starts at the first to run) and the sinks (the last sink to run ends it). The Python
// walk in _modules.py is the same loop, commented line by line, with the output nodes alone hooked for the start.
void walk(const RegionPtr& rec, std::vector<Node*> todo, const std::vector<Node*>& stops) {
  std::vector<Node*> outside;  // frontier nodes met so far (each enters the frontier once)
  auto toFrontier = [&](Node* node) {
    if (contains(outside, node)) return;
    outside.push_back(node);
    rec->frontier.push_back(strongRef(node));
  };
  while (!todo.empty()) {
    Node* node = todo.back();
    todo.pop_back();
    auto found = claims.find(node);
    if (found == claims.end()) {
      if (contains(stops, node)) {
        toFrontier(node);
        continue;
      }
      claims.emplace(node, rec.get());
      claimed.push_back(strongRef(node));
      node->add_pre_hook(std::make_unique<StartHook>(rec));
      bool sink = true;
      for (const torch::autograd::Edge& e : node->next_edges()) {
        Node* f = e.function.get();
        if (f == nullptr || isAccumulateGrad(f)) continue;
        todo.push_back(f);
        if (sink && !contains(stops, f)) {
          auto owner = claims.find(f);
          if (owner == claims.end() || owner->second == rec.get()) sink = false;
        }
      }
      if (sink) {
        node->add_post_hook(std::make_unique<SinkHook>(rec));
        ++rec->pending;
      }
      continue;
    }
    Region* owner = found->second;
    if (owner == rec.get()) continue;
    if (owner->index < rec->index) {  // an earlier module's region
      toFrontier(node);
      continue;
    }
    Region* top = owner;  // a descendant's region: wait for its outermost span below this one, skip its nodes
    while (top->parent && top->parent.get() != rec.get()) top = top->parent.get();
    if (!top->parent) {
      top->parent = rec;
      ++rec->pending;
      for (const auto& f : top->frontier) todo.push_back(f.get());
    }
  }
}

// The backward span of one module call whose forward just returned (forward_done); `outputs` and `inputs` are the
// call's tensors. Nothing is attached when the call created no autograd node of its own.
void attach(int info, int site, int layer, int64_t index, const std::vector<py::handle>& outputs,
            const std::vector<py::handle>& inputs) {
  std::vector<NodePtr> outs = gradFns(outputs);
  if (outs.empty()) return;
  std::vector<Node*> stops;
  for (const auto& n : gradFns(inputs)) stops.push_back(n.get());  // alive: the inputs hold them
  const void* sitePtr = api->site(site);
  if (sitePtr == nullptr) throw py::index_error("unknown span site " + std::to_string(site));
  auto rec = std::make_shared<Region>();
  rec->info = info;
  rec->site = sitePtr;
  rec->layer = layer;
  rec->index = index;
  std::vector<Node*> todo;
  todo.reserve(outs.size());
  for (const auto& n : outs) todo.push_back(n.get());
  std::lock_guard<std::mutex> lock(mu);
  walk(rec, std::move(todo), stops);
  if (rec->pending == 0) return;  // its outputs are its inputs, or views made elsewhere
  rootRegions.push_back(rec);
  open.push_back(rec);
}

// host_stats' dtype codes (span_api.h): 0 float32, 1 float64, 2 float16, 3 bfloat16; -1 for any other.
int hostDtypeCode(at::ScalarType type) {
  constexpr std::array<at::ScalarType, 4> kCodes{at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  const auto it = std::find(kCodes.begin(), kCodes.end(), type);
  return it == kCodes.end() ? -1 : static_cast<int>(it - kCodes.begin());
}

// The module-output check of one leaf module call (_modules._watch_output): the first floating-point tensor of its
// output — a DTensor's local shard — read here when it lies in CPU memory (None: every value finite; else its sum,
// NaN or ±Inf), or handed back as it is when it cannot be read here (on a device, not contiguous, another dtype: the
// caller sums it on its device).
py::object watchOutput(const std::vector<py::handle>& outs) {
  for (py::handle h : outs) {
    const at::Tensor& wrapper = THPVariable_Unpack(h.ptr());
    if (!at::isFloatingType(wrapper.scalar_type())) continue;
    py::object local = py::reinterpret_borrow<py::object>(h);
    if (Py_TYPE(h.ptr()) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {  // a subclass: a DTensor's shard
      static PyObject* const kLocalTensor = PyUnicode_InternFromString("_local_tensor");  // once, not per call
      PyObject* inner = PyObject_GetAttr(h.ptr(), kLocalTensor);
      if (inner == nullptr)
        PyErr_Clear();
      else if (THPVariable_Check(inner))
        local = py::reinterpret_steal<py::object>(inner);
      else
        Py_DECREF(inner);
    }
    const at::Tensor& t = THPVariable_Unpack(local.ptr());
    const int code = hostDtypeCode(t.scalar_type());
    const bool readable = code >= 0 && t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage() &&
                          t.is_contiguous() && (t.numel() == 0 || t.data_ptr() != nullptr);
    if (!readable) return local;
    double sum = 0;
    if (t.numel() > 0 && api->hostNonfinite(t.data_ptr(), t.numel(), code, &sum)) return py::float_(sum);
    return py::none();
  }
  return py::none();
}

// forward_done(info, fwd_site, bwd_site, layer, index, t0, output, inputs, watch, walk), module_hooks.cpp's post-hook:
// a module call's forward returned — its forward span from T0 to now; then, while gradients are enabled, the output
// check (WATCH: a leaf module, below the step's limit) and the backward region's walk (WALK). What _modules._post_hook
// does in Python. Returns the output check's finding: None, a non-finite sum, or the tensor to sum on its device.
py::object forwardDone(int info, int fwdSite, int bwdSite, int layer, int64_t index, uint64_t t0, py::handle output,
                       py::handle inputs, bool watch, bool walk) {
  const void* site = api->site(fwdSite);
  if (site == nullptr) throw py::index_error("unknown span site " + std::to_string(fwdSite));
  api->emitSpan(site, t0, api->ticks(), layer);
  if (!c10::GradMode::is_enabled()) return py::none();
  std::vector<py::handle> outs;
  flatten(output, 0, outs);
  py::object found = watch ? watchOutput(outs) : py::none();
  if (walk) {
    std::vector<py::handle> ins;
    flatten(inputs, 0, ins);
    attach(info, bwdSite, layer, index, outs, ins);
  }
  return found;
}

// storage_key(tensor): the address of the first element of the tensor's storage — the same for a tensor and every
// view of it — or None where it has none in memory (a wrapper subclass, a meta or fake tensor). What
// tpscope._native.storage_key answers through three Python method calls, read here from the TensorImpl: the
// functional collectives' wrappers ask it at every collective and every wait.
py::object storageKey(py::handle h) {
  if (!THPVariable_Check(h.ptr())) return py::none();
  const at::Tensor& t = THPVariable_Unpack(h.ptr());
  if (!t.has_storage()) return py::none();
  const void* base = nullptr;
  try {
    base = t.storage().data();
  } catch (const c10::Error&) {  // a storage whose data may not be read (functionalized, lazy)
    return py::none();
  }
  if (base == nullptr) return py::none();
  return py::int_(reinterpret_cast<uintptr_t>(base));
}

// The outermost module call returned: its regions are complete; forget the walk's tables.
void endRootCall() {
  std::lock_guard<std::mutex> lock(mu);
  for (const RegionPtr& r : rootRegions) r->frontier.clear();
  rootRegions.clear();
  claims.clear();
  claimed.clear();
  if (open.size() > kOpenLimit)  // forwards whose backward never came (evaluation with gradients on)
    open.erase(open.begin(), open.end() - static_cast<std::ptrdiff_t>(kOpenLimit));
}

// backward() returned: the spans whose last node did not run end at the last one that did (or now).
void backwardFinished() {
  std::lock_guard<std::mutex> lock(mu);
  const uint64_t now = api->ticks();
  for (const RegionPtr& r : open) {
    if (!r->done && r->t0 != 0) {
      r->done = true;
      api->emitSpan(r->site, r->t0, std::max(r->t1 != 0 ? r->t1 : now, r->t0), r->layer);
    }
  }
  open.clear();
  running.clear();
}

// The info number of the innermost module whose backward has begun and not ended, or -1.
int current() {
  std::lock_guard<std::mutex> lock(mu);
  return running.empty() ? -1 : running.back()->info;
}

// How many regions are open and claimed nodes held (tests: nothing is kept after backward()).
py::dict stats() {
  std::lock_guard<std::mutex> lock(mu);
  py::dict d;
  d["open"] = open.size();
  d["running"] = running.size();
  d["claimed"] = claimed.size();
  return d;
}

}  // namespace

namespace tpscope::python::regions {
const SpanApi& api() {
  return *::api;
}
py::object forwardDone(int info, int fwdSite, int bwdSite, int layer, int64_t index, uint64_t t0, py::handle output,
                       py::handle inputs, bool watch, bool walk) {
  return ::forwardDone(info, fwdSite, bwdSite, layer, index, t0, output, inputs, watch, walk);
}
void endRootCall() {
  ::endRootCall();
}
}  // namespace tpscope::python::regions

PYBIND11_MODULE(_autograd, m) {
  m.doc() = "tpscope's backward spans of module calls, on LibTorch's autograd graph (see tpscope/_modules.py)";
  // An ImportError either way, which the package answers by walking in Python (tpscope/_modules.py).
  const auto* found = static_cast<const tpscope::python::SpanApi*>(PyCapsule_Import(TPSCOPE_SPAN_API_CAPSULE, 0));
  if (found == nullptr) {
    PyErr_Clear();
    throw py::import_error("tpscope._native has no span API (" TPSCOPE_SPAN_API_CAPSULE "): a different build");
  }
  if (found->version != tpscope::python::kSpanApiVersion)
    throw py::import_error("tpscope._native and tpscope._autograd come from different builds");
  api = found;
  using namespace py::literals;
  m.def("storage_key", &storageKey, "tensor"_a);
  m.def("end_root_call", &endRootCall);
  m.def("backward_finished", &backwardFinished);
  m.def("current", &current);
  m.def("stats", &stats);
  tpscope::python::regions::bindModuleHooks(m);
  m.attr("torch_version") = TPSCOPE_AUTOGRAD_TORCH_VERSION;
}
