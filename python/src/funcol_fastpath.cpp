// tpscope._native's functional-collective wrappers (tpscope/_funcol.py; bindings.h): the callables that take the
// place of torch.distributed._functional_collectives' functions and of its wait_tensor, and the Issue every recorded
// collective is tracked by (tpscope/_collectives.py's c10d path uses the same type).
//
// Why in C: DTensor issues a functional collective every few hundred microseconds between matrix products that leave
// the caches cold. The Python wrapper cost ~25 µs a call and its wait ~10 µs (samples/python/llama_tp.py at TP 2, 64
// collectives a step, bench/python/overhead_alternating.py --entries): some 2 ms of a 140 ms step, the largest part
// of what recording cost. Its own layers (the *args/**kwargs wrapper, the group's cache, the call site's lookups, the
// issue's object, the pending table) were each microseconds of cold bytecode; here they are one C call, which takes
// the call's arguments as they come (vectorcall) and hands them on unchanged.
//
// The common path runs here alone: a group given as (DeviceMesh, dim) or as an object already seen, the call site,
// and one AsyncCollectiveTensor as the result. The call site's rule is here and only here (where, callsite_id: the
// c10d path and STATE.where() ask these too): the module and phase from STATE, a call-site or module override (DDP's
// buckets, the health vote, FSDP2), the program's own line outside every module. Every other path calls back into
// the Python that holds its rules (funcol_setup names them): a group named by a string or a list of ranks (resolved
// at each call: a name may be bound anew), a collective that raised, a result or payload that is a list, a wait that
// raised. What is recorded is the same either way.
//
// Every function here holds the GIL.
#include <Python.h>
#include <structmember.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

#include "bindings.h"
#include "collective_fastpath.h"
#include "tpscope/probes/probes.h"

namespace py = pybind11;
namespace probes = tpscope::probes;

namespace tpscope::python {

namespace {

// ---- Issue: one recorded collective, until it completed or failed -------------------------------------------------

struct IssueObject {
  PyObject ob_base;           // PyObject_HEAD
  unsigned long long handle;  // the recorder's (0 when not recording)
  PyObject* group;            // tpscope group name (str)
  unsigned long long seq;
  PyObject* op;  // logical op (str)
  int layer;
  int phase;
  char done;
  int opId;  // op's text id: its Comm span's site is looked up by it
};

PyTypeObject* issueType = nullptr;

PyObject* newIssue(uint64_t handle, PyObject* group, uint64_t seq, PyObject* op, int opId, int layer, int phase) {
  IssueObject* issue = PyObject_New(IssueObject, issueType);
  if (issue == nullptr) return nullptr;
  issue->handle = handle;
  Py_INCREF(group);
  issue->group = group;
  issue->seq = seq;
  Py_INCREF(op);
  issue->op = op;
  issue->layer = layer;
  issue->phase = phase;
  issue->done = 0;
  issue->opId = opId;
  return reinterpret_cast<PyObject*>(issue);
}

// Issue(handle, group, seq, op, layer, phase): what _collectives.issue_in_group makes for the c10d path.
PyObject* issueNew(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  unsigned long long handle, seq;
  PyObject *group, *op;
  int layer, phase;
  static const char* kNames[] = {"handle", "group", "seq", "op", "layer", "phase", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KUKUii:Issue", const_cast<char**>(kNames), &handle, &group, &seq, &op,
                                   &layer, &phase))
    return nullptr;
  const char* opText = PyUnicode_AsUTF8(op);
  if (opText == nullptr) return nullptr;
  return newIssue(handle, group, seq, op, fastpath::internText(opText), layer, phase);
}

void issueDealloc(PyObject* self) {
  auto* issue = reinterpret_cast<IssueObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(issue->group);
  Py_XDECREF(issue->op);
  PyObject_Free(self);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

PyMemberDef kIssueMembers[] = {
    {"handle", T_ULONGLONG, offsetof(IssueObject, handle), READONLY, "the recorder's handle (0: not recording)"},
    {"group", T_OBJECT_EX, offsetof(IssueObject, group), READONLY, "tpscope group name"},
    {"seq", T_ULONGLONG, offsetof(IssueObject, seq), READONLY, "sequence number in the group (1-based)"},
    {"op", T_OBJECT_EX, offsetof(IssueObject, op), READONLY, "logical op (all_reduce, ...)"},
    {"layer", T_INT, offsetof(IssueObject, layer), READONLY, "layer of the call site, or -1"},
    {"phase", T_INT, offsetof(IssueObject, phase), READONLY, "phase of the call site (kinds.PHASE_*)"},
    {"done", T_BOOL, offsetof(IssueObject, done), 0, "completed or failed (recorded once)"},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot kIssueSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&issueNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&issueDealloc)},
    {Py_tp_members, kIssueMembers},
    {Py_tp_doc, const_cast<char*>("Issue(handle, group, seq, op, layer, phase): one recorded collective, tracked "
                                  "until its completion or failure is recorded (done).")},
    {0, nullptr},
};

PyType_Spec kIssueSpec = {"tpscope._native.Issue", sizeof(IssueObject), 0, Py_TPFLAGS_DEFAULT, kIssueSlots};

// ---- what the wrappers read, set once by funcol_setup -------------------------------------------------------------

struct Context {
  PyObject* state = nullptr;         // tpscope._state.STATE (set_state)
  PyObject* pending = nullptr;       // dict: storage key of a result not yet waited on -> its Issue
  PyObject* asyncType = nullptr;     // AsyncCollectiveTensor
  PyObject* tensorType = nullptr;    // torch.Tensor
  PyObject* storageKey = nullptr;    // (tensor) -> int or None
  PyObject* resolveGroup = nullptr;  // (group, tag) -> (name, group id); raises where it cannot
  PyObject* payload = nullptr;       // (list of tensors) -> (dtype name, shape, bytes)
  PyObject* raised = nullptr;        // (op, group_index, args, kwargs, ticks, exc): a call that raised
  PyObject* track = nullptr;         // (issue, result): a result that is not one AsyncCollectiveTensor
  PyObject* commSite = nullptr;      // (op, phase) -> span site id of the blocked wait
  PyObject* fail = nullptr;          // (issue, exc): a wait that raised
  Py_ssize_t maxPending = 4096;      // results never waited on (dropped by the program) are forgotten beyond this
  // interned names
  PyObject* sCallsiteOverride = nullptr;
  PyObject* sModuleOverride = nullptr;
  PyObject* sInOptimizer = nullptr;
  PyObject* sInBackward = nullptr;
  PyObject* sForwardStack = nullptr;
  PyObject* sInnermostBackward = nullptr;
  PyObject* sName = nullptr;
  PyObject* sLayer = nullptr;
  PyObject* sCompleted = nullptr;
  PyObject* sElem = nullptr;
  PyObject* sGroup = nullptr;
  PyObject* sTag = nullptr;
  PyObject* sTensor = nullptr;
  PyObject* sEmpty = nullptr;

  // A group argument seen before -> its tpscope group. The key's object (a DeviceMesh, a ProcessGroup) is kept
  // referenced, so its address names it for the life of the process.
  struct GroupKey {
    PyObject* anchor;
    long long dim;  // LLONG_MIN: the object itself, not (mesh, dim)
    std::string tag;
    bool operator==(const GroupKey& o) const { return anchor == o.anchor && dim == o.dim && tag == o.tag; }
  };
  struct GroupKeyHash {
    size_t operator()(const GroupKey& k) const {
      return std::hash<const void*>()(k.anchor) ^ (std::hash<long long>()(k.dim) * 31) ^
             std::hash<std::string>()(k.tag);
    }
  };
  struct GroupEntry {
    PyObject* name;  // str, referenced
    long long id;
  };
  std::unordered_map<GroupKey, GroupEntry, GroupKeyHash> groups;
  // (ModuleInfo, phase, display op) -> call-site text id; the ModuleInfo is kept referenced.
  std::unordered_map<PyObject*, std::unordered_map<long long, int>> moduleSites;
  // (program file text id, line, phase, display op) -> call-site text id; bounded: lines are many.
  std::map<std::tuple<int, int, int, int>, int> programSites;
  // (op text id, phase) -> span site of the wait
  std::unordered_map<long long, const probes::Site*> waitSites;
};

Context* ctx = nullptr;  // made when the module loads; leaked, as it holds Python references past the interpreter's
                         // teardown. The wrappers record once funcol_setup gave them what they call (asyncType set).
thread_local int depth = 0;  // a wrapped function called from another (all_gather_tensor -> ...) is not recorded

constexpr size_t kMaxProgramSites = 65536;
constexpr const char* kPhaseNames[] = {"", "forward", "backward", "optimizer", "data", "other"};  // probes::Phase

// ---- the call site ------------------------------------------------------------------------------------------------

long long siteKey(int phase, int what) {
  return (static_cast<long long>(what) << 8) | phase;
}

int joinedText(std::string_view name, int phase, int what) {
  std::string text(name);
  for (std::string_view part : {std::string_view(kPhaseNames[phase]), std::string_view(*fastpath::textAt(what))}) {
    if (part.empty()) continue;
    if (!text.empty()) text += ' ';
    text += part;
  }
  return fastpath::internText(text);
}

// The call site of module call INFO (a ModuleInfo) for op WHAT in PHASE. False with an exception set.
bool moduleSite(PyObject* info, int phase, int what, int& cid) {
  auto& sites = ctx->moduleSites[info];
  if (sites.empty()) Py_INCREF(info);  // first sight: kept, so that its address keeps naming it
  if (auto it = sites.find(siteKey(phase, what)); it != sites.end()) {
    cid = it->second;
    return true;
  }
  PyObject* name = PyObject_GetAttr(info, ctx->sName);
  if (name == nullptr) return false;
  const char* text = PyUnicode_AsUTF8(name);
  if (text != nullptr) cid = joinedText(text, phase, what);
  Py_DECREF(name);
  if (text == nullptr) return false;
  sites.emplace(siteKey(phase, what), cid);
  return true;
}

// The call site outside every module: the program's own line (or none).
int programSite(int phase, int what) {
  int line = 0;
  const int file = fastpath::programFrame(line);
  const auto key = std::make_tuple(file, line, phase, what);
  if (auto it = ctx->programSites.find(key); it != ctx->programSites.end()) return it->second;
  const int cid =
      joinedText(file >= 0 ? *fastpath::textAt(file) + ":" + std::to_string(line) : std::string(), phase, what);
  if (ctx->programSites.size() < kMaxProgramSites) ctx->programSites.emplace(key, cid);
  return cid;
}

int truthy(PyObject* owner, PyObject* name) {
  PyObject* v = PyObject_GetAttr(owner, name);
  if (v == nullptr) return -1;
  const int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  return t;
}

// Where a collective issued now belongs (STATE.where(), tpscope/_state.py): the phase — optimizer, backward, forward
// or none, in that order — and the module: the one module_override names (FSDP2 moving a module's parameters from
// another module's hook), else the module running now — in backward the innermost one whose backward has begun, else
// the innermost forward call (in backward too: a checkpointed region's recomputation) —, or none outside every module.
struct Where {
  PyObject* info = nullptr;  // the module's ModuleInfo (a new reference), or
  PyObject* name = nullptr;  // the name module_override gives (a new reference)
  int layer = -1;
  int phase = 0;
  Where() = default;
  Where(const Where&) = delete;
  Where& operator=(const Where&) = delete;
  ~Where() {
    Py_XDECREF(info);
    Py_XDECREF(name);
  }
};

// Fills W from STATE; false with an exception set.
bool where(Where& w) {
  PyObject* state = ctx->state;
  if (state == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "tpscope._native.set_state was not called");
    return false;
  }
  const int inOptimizer = truthy(state, ctx->sInOptimizer);
  const int inBackward = truthy(state, ctx->sInBackward);
  if (inOptimizer < 0 || inBackward < 0) return false;
  PyObject* stack = PyObject_GetAttr(state, ctx->sForwardStack);
  if (stack == nullptr) return false;
  const bool inForward = PyList_Check(stack) && PyList_GET_SIZE(stack) > 0;
  w.phase = static_cast<int>(inOptimizer  ? probes::Phase::Optimizer
                             : inBackward ? probes::Phase::Backward
                             : inForward  ? probes::Phase::Forward
                                          : probes::Phase::None);
  PyObject* override = PyObject_GetAttr(state, ctx->sModuleOverride);
  bool ok = override != nullptr;
  if (ok && override != Py_None) {  // (name, layer)
    ok = PyArg_ParseTuple(override, "Ui", &w.name, &w.layer);
    if (ok)
      Py_INCREF(w.name);
    else
      w.name = nullptr;
  } else if (ok) {
    if (inBackward) {
      w.info = PyObject_CallMethodNoArgs(state, ctx->sInnermostBackward);
      ok = w.info != nullptr;
      if (w.info == Py_None) Py_CLEAR(w.info);
    }
    if (ok && w.info == nullptr && inForward) {
      PyObject* call = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);  // (module, ModuleInfo, t0, index)
      if (PyTuple_Check(call) && PyTuple_GET_SIZE(call) > 1) {
        w.info = PyTuple_GET_ITEM(call, 1);
        Py_INCREF(w.info);
      }
    }
    if (ok && w.info != nullptr) {
      PyObject* layer = PyObject_GetAttr(w.info, ctx->sLayer);
      ok = layer != nullptr;
      if (ok) w.layer = static_cast<int>(PyLong_AsLong(layer));
      Py_XDECREF(layer);
      ok = ok && !(w.layer == -1 && PyErr_Occurred());
    }
  }
  Py_XDECREF(override);
  Py_DECREF(stack);
  return ok;
}

// (call-site id, layer, phase) of a collective issued now for display op WHAT: the text STATE.callsite_override gives
// (DDP's buckets, the health vote), else "<module> <phase> <what>" of where() — outside every module, the program's own
// line (program_frame) in the module's place. False with an exception set.
bool callsite(int what, int& cid, int& layer, int& phase) {
  if (ctx->state != nullptr) {  // else where() says set_state was not called
    PyObject* override = PyObject_GetAttr(ctx->state, ctx->sCallsiteOverride);
    if (override == nullptr) return false;
    if (override != Py_None) {  // (text, phase)
      const char* text = nullptr;
      const bool ok = PyArg_ParseTuple(override, "si", &text, &phase);
      if (ok) cid = fastpath::internText(text);
      layer = -1;
      Py_DECREF(override);
      return ok;
    }
    Py_DECREF(override);
  }
  Where w;
  if (!where(w)) return false;
  phase = w.phase;
  layer = w.layer;
  if (w.info != nullptr) return moduleSite(w.info, phase, what, cid);
  if (w.name != nullptr) {
    const char* name = PyUnicode_AsUTF8(w.name);
    if (name == nullptr) return false;
    cid = joinedText(name, phase, what);
    return true;
  }
  cid = programSite(phase, what);
  return true;
}

// ---- the tpscope group of a call's group argument -----------------------------------------------------------------

// NAME (a new reference) and GID of the group a functional collective names with GROUP and TAG (either may be null:
// not given). A (DeviceMesh, int) pair or an object (a mesh, a ProcessGroup) is resolved once — through funcol's
// _resolve_group, tens of microseconds — and kept; a name or a list of ranks is resolved at each call (a name may be
// bound anew after destroy_process_group). False with an exception set where it cannot be resolved.
bool groupOf(PyObject* group, PyObject* tag, PyObject*& name, long long& gid) {
  if (group == nullptr) group = Py_None;
  if (tag == nullptr) tag = ctx->sEmpty;
  bool keep = PyUnicode_Check(tag) && group != Py_None && !PyUnicode_Check(group) && !PyList_Check(group);
  Context::GroupKey key{group, LLONG_MIN, {}};
  if (keep && PyTuple_CheckExact(group)) {
    keep = PyTuple_GET_SIZE(group) == 2 && PyLong_CheckExact(PyTuple_GET_ITEM(group, 1));
    if (keep) {
      key.anchor = PyTuple_GET_ITEM(group, 0);
      key.dim = PyLong_AsLongLong(PyTuple_GET_ITEM(group, 1));
      if (key.dim == -1 && PyErr_Occurred()) return false;
    }
  }
  if (keep) {
    const char* tagText = PyUnicode_AsUTF8(tag);
    if (tagText == nullptr) return false;
    key.tag = tagText;
    if (auto it = ctx->groups.find(key); it != ctx->groups.end()) {
      name = it->second.name;
      Py_INCREF(name);
      gid = it->second.id;
      return true;
    }
  }
  PyObject* r = PyObject_CallFunctionObjArgs(ctx->resolveGroup, group, tag, nullptr);
  if (r == nullptr) return false;
  PyObject* n = nullptr;
  const bool ok = PyArg_ParseTuple(r, "UL", &n, &gid);
  if (ok) {
    name = n;
    Py_INCREF(name);
  }
  Py_DECREF(r);
  if (!ok) return false;
  if (keep) {
    Py_INCREF(key.anchor);  // kept: a freed object's address may be reused by another
    Py_INCREF(name);
    ctx->groups.emplace(std::move(key), Context::GroupEntry{name, gid});
  }
  return true;
}

// ---- the wrappers -------------------------------------------------------------------------------------------------

struct WrapperObject {
  PyObject ob_base;  // PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* original;  // the function it stands for
  PyObject* op;        // logical op (str); None for wait_tensor
  int opId;
  int whatId;      // the op's display text ("all-reduce"): the call site ends in it
  int groupIndex;  // positional index of the group argument (the tag's follows it)
  PyObject* dict;  // __dict__: functools.update_wrapper's attributes, __tpscope_original__
};

PyTypeObject* wrapperType = nullptr;

// The argument at positional INDEX or named NAME of a vectorcall, borrowed; nullptr when not given.
PyObject* argument(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, Py_ssize_t index, PyObject* name) {
  if (index < nargs) return args[index];
  if (kwnames != nullptr) {
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(kwnames); i < n; ++i) {
      PyObject* k = PyTuple_GET_ITEM(kwnames, i);
      if (k == name || PyUnicode_Compare(k, name) == 0) return args[nargs + i];
    }
  }
  return nullptr;
}

// The call's arguments as Python gives them to a function (args, kwargs): for the slow paths.
bool packArguments(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject*& tuple, PyObject*& dict) {
  tuple = PyTuple_New(nargs);
  dict = PyDict_New();
  if (tuple == nullptr || dict == nullptr) {
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SET_ITEM(tuple, i, args[i]);
  }
  for (Py_ssize_t i = 0, n = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0; i < n; ++i) {
    if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
      Py_DECREF(tuple);
      Py_DECREF(dict);
      return false;
    }
  }
  return true;
}

// Calls FN(ARGS...) for its effect while an exception is pending: the exception stays the one raised; an error of the
// call itself is reported as unraisable (it must not replace the program's).
template <typename... Args>
void callBeside(PyObject* fn, const char* format, Args... args) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  PyObject* r = PyObject_CallFunction(fn, format, args..., value != nullptr ? value : Py_None);
  if (r == nullptr)
    PyErr_WriteUnraisable(fn);
  else
    Py_DECREF(r);
  PyErr_Restore(type, value, traceback);
}

void complete(IssueObject* issue) {
  if (issue->done) return;
  issue->done = 1;
  if (probes::Sink* sink = probes::sink())
    sink->collectiveState(issue->handle, probes::CollectiveState::Completed, probes::rawTicks());
}

// The Issue of a call that returned: nullptr with no exception set when it is not recorded (its group cannot be
// resolved here), nullptr with one set on an error.
PyObject* issueCall(const WrapperObject* w, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                    uint64_t ticks) {
  PyObject* name = nullptr;
  long long gid = 0;
  if (!groupOf(argument(args, nargs, kwnames, w->groupIndex, ctx->sGroup),
               argument(args, nargs, kwnames, w->groupIndex + 1, ctx->sTag), name, gid)) {
    PyErr_Clear();  // a group form this PyTorch does not resolve here: the call runs unrecorded
    return nullptr;
  }
  int cid = 0, layer = -1, phase = 0;
  if (!callsite(w->whatId, cid, layer, phase)) {
    Py_DECREF(name);
    return nullptr;
  }
  PyObject* payload = nargs > 0 ? args[0] : Py_None;
  PyObject* described = nullptr;  // a list of tensors: (dtype name, shape, bytes), described by _collectives
  if (payload != Py_None) {
    const int isTensor = PyObject_IsInstance(payload, ctx->tensorType);
    if (isTensor == 0) payload = described = PyObject_CallOneArg(ctx->payload, payload);
    if (isTensor < 0 || payload == nullptr) {
      Py_DECREF(name);
      return nullptr;
    }
  }
  uint64_t handle = 0, seq = 0;
  const bool ok = fastpath::issue(gid, w->opId, cid, layer, phase, payload, ticks, handle, seq);
  Py_XDECREF(described);
  PyObject* issue = ok ? newIssue(handle, name, seq, w->op, w->opId, layer, phase) : nullptr;
  Py_DECREF(name);
  return issue;
}

// Where a call's result completes: at once when it was waited on already; else at the first wait_tensor on its
// storage (keyed by storage: the wait may come on a view of it — an AsyncCollectiveTensor's aten.view makes a new one
// around a view of its elem —, and c10d's functional wait waits on the work that owns the storage).
bool track(PyObject* issue, PyObject* result) {
  if (Py_TYPE(result) != reinterpret_cast<PyTypeObject*>(ctx->asyncType)) {  // a list of results, or a plain tensor
    PyObject* r = PyObject_CallFunctionObjArgs(ctx->track, issue, result, nullptr);
    Py_XDECREF(r);
    return r != nullptr;
  }
  const int completed = truthy(result, ctx->sCompleted);
  if (completed < 0) return false;
  if (completed) {
    complete(reinterpret_cast<IssueObject*>(issue));
    return true;
  }
  PyObject* elem = PyObject_GetAttr(result, ctx->sElem);
  if (elem == nullptr) return false;
  PyObject* key = PyObject_CallOneArg(ctx->storageKey, elem);
  Py_DECREF(elem);
  if (key == nullptr) return false;
  int rc = 0;
  if (key != Py_None) {
    if (PyDict_GET_SIZE(ctx->pending) >= ctx->maxPending) PyDict_Clear(ctx->pending);
    rc = PyDict_SetItem(ctx->pending, key, issue);
  }
  Py_DECREF(key);
  return rc == 0;
}

// A functional collective: recorded once (the outermost wrapped call), after it returned, with the time it was made —
// in eager mode it returns as soon as it is on its way, so this bookkeeping runs while its data moves, not before it
// starts, when a peer already in the collective would wait for it.
PyObject* callRecorded(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* w = reinterpret_cast<WrapperObject*>(self);
  if (depth != 0 || ctx->asyncType == nullptr || !packageRecording())
    return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  const uint64_t ticks = probes::rawTicks();
  ++depth;
  PyObject* result = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  --depth;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (result == nullptr) {  // recorded and failed by _funcol._raised, the exception left as it was
    PyObject *tuple, *dict;
    if (packArguments(args, nargs, kwnames, tuple, dict)) {
      callBeside(ctx->raised, "OiOOKO", w->op, w->groupIndex, tuple, dict, static_cast<unsigned long long>(ticks));
      Py_DECREF(tuple);
      Py_DECREF(dict);
    } else {
      PyErr_WriteUnraisable(self);
    }
    return nullptr;
  }
  PyObject* issue = issueCall(w, args, nargs, kwnames, ticks);
  if (issue == nullptr) {
    if (!PyErr_Occurred()) return result;
    Py_DECREF(result);
    return nullptr;
  }
  const bool ok = track(issue, result);
  Py_DECREF(issue);
  if (!ok) Py_CLEAR(result);
  return result;
}

// The span site of a wait on ISSUE's op in its phase (_collectives._comm_site), or nullptr with an exception set.
const probes::Site* waitSite(const IssueObject* issue) {
  const long long key = static_cast<long long>(issue->opId) << 8 | issue->phase;
  if (auto it = ctx->waitSites.find(key); it != ctx->waitSites.end()) return it->second;
  PyObject* r = PyObject_CallFunction(ctx->commSite, "Oi", issue->op, issue->phase);
  if (r == nullptr) return nullptr;
  const long id = PyLong_AsLong(r);
  Py_DECREF(r);
  if (id == -1 && PyErr_Occurred()) return nullptr;
  const probes::Site* site = spanSite(static_cast<int>(id));
  if (site == nullptr) {
    PyErr_Format(PyExc_IndexError, "unknown span site %ld", id);
    return nullptr;
  }
  ctx->waitSites.emplace(key, site);
  return site;
}

// wait_tensor: the first wait on a recorded result's storage records its completion and a Comm span for the time the
// thread was blocked in it, as RecordedWork.wait does for c10d.
PyObject* callWait(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* w = reinterpret_cast<WrapperObject*>(self);
  if (ctx->pending == nullptr ||
      PyDict_GET_SIZE(ctx->pending) == 0)  // nothing issued waits (recording off, all waited on)
    return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  PyObject* tensor = argument(args, PyVectorcall_NARGS(nargsf), kwnames, 0, ctx->sTensor);
  if (tensor == nullptr) return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  PyObject* key = PyObject_CallOneArg(ctx->storageKey, tensor);
  if (key == nullptr) return nullptr;
  PyObject* found = nullptr;
  if (key != Py_None) {
    found = PyDict_GetItemWithError(ctx->pending, key);  // borrowed
    Py_XINCREF(found);
    if (found != nullptr && PyDict_DelItem(ctx->pending, key) < 0) Py_CLEAR(found);
  }
  Py_DECREF(key);
  if (PyErr_Occurred()) {
    Py_XDECREF(found);
    return nullptr;
  }
  auto* issue = reinterpret_cast<IssueObject*>(found);
  if (issue == nullptr || Py_TYPE(found) != issueType || issue->done) {
    Py_XDECREF(found);
    return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  }
  const uint64_t t0 = probes::rawTicks();
  PyObject* out = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
  if (out == nullptr) {
    callBeside(ctx->fail, "OO", found);
  } else {
    issue->done = 1;
    const probes::Site* site = waitSite(issue);
    if (site == nullptr) {
      Py_CLEAR(out);
    } else if (probes::Sink* sink = probes::sink()) {
      const uint64_t t1 = probes::rawTicks();
      probes::emitSpan(site, t0, t1, issue->layer);
      sink->collectiveState(issue->handle, probes::CollectiveState::Completed, t1);
    }
  }
  Py_DECREF(found);
  return out;
}

int wrapperTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* w = reinterpret_cast<WrapperObject*>(self);
  Py_VISIT(w->original);
  Py_VISIT(w->op);
  Py_VISIT(w->dict);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

int wrapperClear(PyObject* self) {
  auto* w = reinterpret_cast<WrapperObject*>(self);
  Py_CLEAR(w->original);
  Py_CLEAR(w->op);
  Py_CLEAR(w->dict);
  return 0;
}

void wrapperDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  wrapperClear(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

PyObject* wrapperRepr(PyObject* self) {
  auto* w = reinterpret_cast<WrapperObject*>(self);
  return PyUnicode_FromFormat("<tpscope recorded %R>", w->original);
}

PyMemberDef kWrapperMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(WrapperObject, vectorcall), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(WrapperObject, dict), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyGetSetDef kWrapperGetSet[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kWrapperSlots[] = {
    {Py_tp_call, reinterpret_cast<void*>(&PyVectorcall_Call)},
    {Py_tp_traverse, reinterpret_cast<void*>(&wrapperTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(&wrapperClear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&wrapperDealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(&wrapperRepr)},
    {Py_tp_members, kWrapperMembers},
    {Py_tp_getset, kWrapperGetSet},
    {Py_tp_doc, const_cast<char*>("A functional collective (or wait_tensor) recorded by tpscope: made by "
                                  "funcol_wrapper / funcol_wait_wrapper.")},
    {0, nullptr},
};

PyType_Spec kWrapperSpec = {"tpscope._native.FuncolWrapper", sizeof(WrapperObject), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, kWrapperSlots};

py::object makeWrapper(py::handle original, vectorcallfunc call, py::handle op, int groupIndex,
                       const std::string& what) {
  auto* w = PyObject_GC_New(WrapperObject, wrapperType);
  if (w == nullptr) throw py::error_already_set();
  w->vectorcall = call;
  w->original = original.inc_ref().ptr();
  w->op = op.inc_ref().ptr();
  w->opId = PyUnicode_Check(op.ptr()) ? fastpath::internText(PyUnicode_AsUTF8(op.ptr())) : -1;
  w->whatId = fastpath::internText(what);
  w->groupIndex = groupIndex;
  w->dict = nullptr;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(w));
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(w));
}

PyObject* interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw py::error_already_set();
  return o;
}

}  // namespace

void bindFuncolFastPath(py::module_& m) {
  using namespace py::literals;
  issueType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kIssueSpec));
  wrapperType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kWrapperSpec));
  if (issueType == nullptr || wrapperType == nullptr) throw py::error_already_set();
  m.attr("Issue") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(issueType));
  m.attr("FuncolWrapper") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(wrapperType));
  auto* c = new Context();
  c->sCallsiteOverride = interned("callsite_override");
  c->sModuleOverride = interned("module_override");
  c->sInOptimizer = interned("in_optimizer");
  c->sInBackward = interned("in_backward");
  c->sForwardStack = interned("forward_stack");
  c->sInnermostBackward = interned("innermost_backward");
  c->sName = interned("name");
  c->sLayer = interned("layer");
  c->sCompleted = interned("completed");
  c->sElem = interned("elem");
  c->sGroup = interned("group");
  c->sTag = interned("tag");
  c->sTensor = interned("tensor");
  c->sEmpty = interned("");
  ctx = c;
  m.def(
      "set_state", [](py::object state) { ctx->state = state.release().ptr(); }, "state"_a,
      "The STATE where() and callsite_id read (tpscope/_state.py, once).");
  m.def(
      "where",
      []() -> py::tuple {
        Where w;
        if (!where(w)) throw py::error_already_set();
        py::object name = py::none();
        if (w.name != nullptr)
          name = py::reinterpret_borrow<py::object>(w.name);
        else if (w.info != nullptr)
          name = py::reinterpret_steal<py::object>(PyObject_GetAttr(w.info, ctx->sName));
        if (!name) throw py::error_already_set();
        return py::make_tuple(name, w.layer, w.phase);
      },
      "(module name or None, layer, phase) of a collective issued now, from STATE: what STATE.where() answers.");
  m.def(
      "callsite_id",
      [](const std::string& what) {
        int cid = 0, layer = -1, phase = 0;
        if (!callsite(fastpath::internText(what), cid, layer, phase)) throw py::error_already_set();
        return py::make_tuple(cid, layer, phase);
      },
      "what"_a,
      "(call-site text id, layer, phase) of a collective issued now whose call site ends in WHAT: STATE's "
      "callsite_override, else '<module> <phase> <what>' of where(), the program's own line outside every module.");
  m.def(
      "funcol_setup",
      [](py::dict pending, py::object asyncType, py::object tensorType, py::object storageKey, py::object resolveGroup,
         py::object payload, py::object raised, py::object track, py::object commSite, py::object fail,
         Py_ssize_t maxPending) {
        ctx->pending = pending.release().ptr();
        ctx->tensorType = tensorType.release().ptr();
        ctx->storageKey = storageKey.release().ptr();
        ctx->resolveGroup = resolveGroup.release().ptr();
        ctx->payload = payload.release().ptr();
        ctx->raised = raised.release().ptr();
        ctx->track = track.release().ptr();
        ctx->commSite = commSite.release().ptr();
        ctx->fail = fail.release().ptr();
        ctx->maxPending = maxPending;
        ctx->asyncType = asyncType.release().ptr();  // last: the wrappers record from here on
      },
      "pending"_a, "async_type"_a, "tensor_type"_a, "storage_key"_a, "resolve_group"_a, "payload"_a, "raised"_a,
      "track"_a, "comm_site"_a, "fail"_a, "max_pending"_a,
      "What the functional-collective wrappers read and call back into (tpscope/_funcol.py's install, once).");
  m.def(
      "funcol_wrapper",
      [](py::handle original, py::str op, const std::string& what, int groupIndex) {
        return makeWrapper(original, &callRecorded, op, groupIndex, what);
      },
      "original"_a, "op"_a, "what"_a, "group_index"_a,
      "A callable that records each outermost call of ORIGINAL (a functional collective of logical op OP, its call "
      "site ending in WHAT, its group the positional argument GROUP_INDEX or `group`, the tag the next or `tag`) and "
      "returns what ORIGINAL returns.");
  m.def(
      "funcol_wait_wrapper", [](py::handle original) { return makeWrapper(original, &callWait, py::none(), 0, ""); },
      "original"_a,
      "A callable for funcol.wait_tensor: the first wait on a recorded result's storage records its completion and "
      "the time blocked in it.");
}

}  // namespace tpscope::python
