// The collective wrappers' hot path (tpscope/_collectives.py, _funcol.py; bindings.h): what every recorded
// collective and every wait calls, as METH_FASTCALL functions on small integers.
//
// Why: a TP program issues a collective every few hundred microseconds between large matrix products, which leave
// the caches cold; there every Python-level call, attribute read and argument conversion of the wrapper costs
// microseconds, not the tens of nanoseconds a warm loop shows. Measured in samples/python/llama_tp.py (TP 2, 64
// functional collectives a step), the wrapper around one call took ~55 µs beside the call itself, of which the
// pybind11 call of collective_enqueued (the call this replaced: 13 converted arguments, strings and lists) ~11 µs,
// the payload's dtype, shape and bytes ~5 µs, and the walk to the program's own frame (collectives issued outside
// every module, e.g. 27 a step in AdamW over DTensor parameters) ~14 µs. Here the group, op and call-site strings are
// interned once and passed as ints, the group's sequence number lives beside its name, the tensor's payload is read
// through the C API, and the frame walk caches each code object's verdict.
//
// Every function here holds the GIL (it touches Python objects); the registries need no lock of their own.
#include "collective_fastpath.h"

#include <Python.h>
#include <frameobject.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bindings.h"
#include "tpscope/probes/probes.h"

namespace py = pybind11;
namespace probes = tpscope::probes;

namespace tpscope::python {

namespace {

struct Group {
  std::string name;
  std::vector<int> ranks;
  uint64_t seq =
      0;  // the last sequence number issued in it (1-based, per name: the c10d and functional paths share it)
};

// Interned strings and groups, for the life of the process (the recorder copies what it keeps: a record holds no
// pointer into these). Bounded by what a program names: its groups, ops, call sites and dtypes.
struct Registry {
  std::deque<std::string> texts;
  std::unordered_map<std::string, int> textIds;
  std::deque<Group> groups;
  std::unordered_map<std::string, int> groupIds;
  std::unordered_map<PyObject*, int> dtypeNames;    // torch.dtype (a singleton, kept referenced) -> text id
  std::unordered_map<PyObject*, int> programFiles;  // code object (kept referenced) -> text id of its file's base
                                                    // name, or -1 where the code is torch's or tpscope's own
  std::vector<std::string> foreignDirs;             // folders whose code is not the program's
  PyObject* nameDtype = nullptr;                    // interned attribute and method names
  PyObject* nameShape = nullptr;
  PyObject* nameNbytes = nullptr;
  PyObject* nameDataPtr = nullptr;
  PyObject* nameStorageOffset = nullptr;
  PyObject* nameElementSize = nullptr;

  static Registry& instance() {
    static Registry* r = new Registry();  // leaked: it holds Python references past the interpreter's teardown
    return *r;
  }

  int text(std::string_view s) {
    std::string key(s);
    if (auto it = textIds.find(key); it != textIds.end()) return it->second;
    texts.emplace_back(key);
    const int id = static_cast<int>(texts.size()) - 1;
    textIds.emplace(std::move(key), id);
    return id;
  }
};

constexpr size_t kMaxProgramFiles = 1 << 16;  // code objects remembered (a program's own functions and torch's)

const std::string* textAt(int id) {
  Registry& r = Registry::instance();
  return id < 0 || static_cast<size_t>(id) >= r.texts.size() ? nullptr : &r.texts[static_cast<size_t>(id)];
}

bool argInt(PyObject* o, long long& out, const char* what) {
  out = PyLong_AsLongLong(o);
  if (out == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_TypeError, "%s must be an int", what);
    return false;
  }
  return true;
}

bool argTicks(PyObject* o, uint64_t& out, const char* what) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Format(PyExc_TypeError, "%s must be a non-negative int (ticks())", what);
    return false;
  }
  out = v;
  return true;
}

// The name of a torch.dtype ("float32"), interned; -1 with an exception set on failure.
int dtypeName(PyObject* dtype) {
  Registry& r = Registry::instance();
  if (auto it = r.dtypeNames.find(dtype); it != r.dtypeNames.end()) return it->second;
  PyObject* text = PyObject_Str(dtype);
  if (text == nullptr) return -1;
  const char* s = PyUnicode_AsUTF8(text);
  if (s == nullptr) {
    Py_DECREF(text);
    return -1;
  }
  std::string_view name(s);
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  const int id = r.text(name);
  Py_DECREF(text);
  Py_INCREF(dtype);
  r.dtypeNames.emplace(dtype, id);
  return id;
}

// A collective's input: None (no payload), a tensor (its dtype, shape and bytes read here) or a tuple (dtype name,
// shape, bytes) the caller computed (a list of tensors). False with an exception set on failure.
struct Payload {
  int dtype = -1;  // text id; -1: "none"
  std::vector<int64_t> shape;
  int64_t bytes = 0;
};

bool readShape(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "a shape must be a sequence of ints");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out[static_cast<size_t>(i)] = v;
  }
  Py_DECREF(fast);
  return true;
}

bool readPayload(PyObject* x, Payload& p) {
  if (x == Py_None) return true;
  Registry& r = Registry::instance();
  if (PyTuple_Check(x)) {  // (dtype name, shape, bytes)
    if (PyTuple_GET_SIZE(x) != 3) {
      PyErr_SetString(PyExc_ValueError, "a described payload is (dtype name, shape, bytes)");
      return false;
    }
    const char* dtype = PyUnicode_AsUTF8(PyTuple_GET_ITEM(x, 0));
    if (dtype == nullptr) return false;
    p.dtype = std::string_view(dtype) == "none" ? -1 : r.text(dtype);
    long long bytes;
    if (!readShape(PyTuple_GET_ITEM(x, 1), p.shape) || !argInt(PyTuple_GET_ITEM(x, 2), bytes, "bytes")) return false;
    p.bytes = bytes;
    return true;
  }
  PyObject* dtype = PyObject_GetAttr(x, r.nameDtype);
  if (dtype == nullptr) return false;
  p.dtype = dtypeName(dtype);
  Py_DECREF(dtype);
  if (p.dtype < 0) return false;
  PyObject* shape = PyObject_GetAttr(x, r.nameShape);
  if (shape == nullptr) return false;
  const bool shapeOk = readShape(shape, p.shape);
  Py_DECREF(shape);
  if (!shapeOk) return false;
  PyObject* bytes = PyObject_GetAttr(x, r.nameNbytes);
  if (bytes == nullptr) return false;
  long long n;
  const bool bytesOk = argInt(bytes, n, "nbytes");
  Py_DECREF(bytes);
  p.bytes = n;
  return bytesOk;
}

// collective_issue(group_id, op_id, callsite_id, layer, phase, payload, ticks) -> (handle, seq)
PyObject* collectiveIssue(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError,
                    "collective_issue(group_id, op_id, callsite_id, layer, phase, payload, ticks) takes 7 arguments");
    return nullptr;
  }
  long long groupId, opId, callsiteId, layer, phase;
  uint64_t ticks, handle, seq;
  if (!argInt(args[0], groupId, "group_id") || !argInt(args[1], opId, "op_id") ||
      !argInt(args[2], callsiteId, "callsite_id") || !argInt(args[3], layer, "layer") ||
      !argInt(args[4], phase, "phase") || !argTicks(args[6], ticks, "ticks") ||
      !fastpath::issue(groupId, opId, callsiteId, layer, phase, args[5], ticks, handle, seq))
    return nullptr;
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(handle), static_cast<unsigned long long>(seq));
}

// program_frame() -> "file.py:line" of the innermost frame whose code is the program's own (outside the foreign
// folders), or "".
PyObject* programFrame(PyObject*, PyObject* const*, Py_ssize_t nargs) {
  if (nargs != 0) {
    PyErr_SetString(PyExc_TypeError, "program_frame() takes no arguments");
    return nullptr;
  }
  int line = 0;
  const int file = fastpath::programFrame(line);
  if (file < 0) return PyUnicode_FromString("");
  return PyUnicode_FromFormat("%s:%d", textAt(file)->c_str(), line);
}

// storage_key(tensor) -> the address of its storage's first element (data_ptr less its offset), the same for a
// tensor and every view of it; None where it has none (a meta or sparse tensor, a subclass without storage).
PyObject* storageKey(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "storage_key(tensor) takes 1 argument");
    return nullptr;
  }
  Registry& r = Registry::instance();
  long long v[3];
  PyObject* names[3] = {r.nameDataPtr, r.nameStorageOffset, r.nameElementSize};
  for (int i = 0; i < 3; ++i) {
    PyObject* out = PyObject_CallMethodNoArgs(args[0], names[i]);
    if (out == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_RuntimeError) && !PyErr_ExceptionMatches(PyExc_NotImplementedError))
        return nullptr;
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    v[i] = PyLong_AsLongLong(out);
    Py_DECREF(out);
    if (v[i] == -1 && PyErr_Occurred()) return nullptr;
  }
  const long long key = v[0] - v[1] * v[2];
  if (key == 0) Py_RETURN_NONE;
  return PyLong_FromLongLong(key);
}

// collective_waited(handle, site, t0, layer): defined in recorder_binding.cpp's terms (a span and a completion).
PyObject* collectiveWaited(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "collective_waited(handle, site, t0, layer) takes 4 arguments");
    return nullptr;
  }
  uint64_t handle, t0;
  long long site, layer;
  if (!argTicks(args[0], handle, "handle") || !argInt(args[1], site, "site") || !argTicks(args[2], t0, "t0") ||
      !argInt(args[3], layer, "layer"))
    return nullptr;
  const probes::Site* s = spanSite(static_cast<int>(site));
  if (s == nullptr) {
    PyErr_Format(PyExc_IndexError, "unknown span site %lld", site);
    return nullptr;
  }
  if (probes::Sink* sink = probes::sink()) {
    const uint64_t t1 = probes::rawTicks();
    probes::emitSpan(s, t0, t1, static_cast<int>(layer));
    sink->collectiveState(handle, probes::CollectiveState::Completed, t1);
  }
  Py_RETURN_NONE;
}

PyMethodDef kFastMethods[] = {
    {"collective_issue", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&collectiveIssue)), METH_FASTCALL,
     "collective_issue(group_id, op_id, callsite_id, layer, phase, payload, ticks) -> (handle, seq)\n\n"
     "Flight-recorder record of one collective in group GROUP_ID (collective_group), op and call site OP_ID and "
     "CALLSITE_ID (intern_text), on PAYLOAD (a tensor, None, or (dtype name, shape, bytes)), enqueued and started "
     "at TICKS (0: now). Takes the group's next sequence number; HANDLE (for collective_state and "
     "collective_waited) is 0 when not recording."},
    {"program_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&programFrame)), METH_FASTCALL,
     "program_frame() -> 'file.py:line' of the innermost frame outside the folders set_foreign_dirs named, or ''."},
    {"storage_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&storageKey)), METH_FASTCALL,
     "storage_key(tensor) -> the address of its storage's first element (the same for every view), or None."},
    {"collective_waited", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&collectiveWaited)), METH_FASTCALL,
     "collective_waited(handle, site, t0, layer): a wait for collective HANDLE that blocked the thread from T0 "
     "(ticks()) returned now: the Comm span (SITE) and the completion, at one instant, in one call."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

namespace fastpath {

int internText(std::string_view text) {
  return Registry::instance().text(text);
}

const std::string* textAt(int id) {
  return python::textAt(id);
}

bool issue(long long groupId, long long opId, long long callsiteId, long long layer, long long phase, PyObject* payload,
           uint64_t ticks, uint64_t& handle, uint64_t& seq) {
  Registry& r = Registry::instance();
  if (groupId < 0 || static_cast<size_t>(groupId) >= r.groups.size()) {
    PyErr_Format(PyExc_ValueError, "unknown collective group id %lld", groupId);
    return false;
  }
  const std::string* op = textAt(static_cast<int>(opId));
  const std::string* callsite = textAt(static_cast<int>(callsiteId));
  if (op == nullptr || callsite == nullptr) {
    PyErr_SetString(PyExc_ValueError, "unknown op or call-site text id");
    return false;
  }
  if (phase < 0 || phase > static_cast<int>(probes::Phase::Other)) {
    PyErr_Format(PyExc_ValueError, "phase %lld is not a tpscope Phase", phase);
    return false;
  }
  Payload p;
  if (!readPayload(payload, p)) return false;
  Group& g = r.groups[static_cast<size_t>(groupId)];
  seq = ++g.seq;
  handle = 0;
  if (probes::Sink* sink = probes::sink()) {
    const uint64_t t = ticks != 0 ? ticks : probes::rawTicks();
    probes::CollectiveDesc d;
    d.group = g.name;
    d.groupRanks = g.ranks;
    d.seq = seq;
    d.op = *op;
    static const std::string kNone = "none";
    d.dtype = p.dtype >= 0 ? *textAt(p.dtype) : kNone;
    d.shape = p.shape;
    int64_t numel = p.dtype < 0 && p.shape.empty() ? 0 : 1;
    for (int64_t s : p.shape) numel *= s;
    d.numel = numel;
    d.bytes = p.bytes;
    d.callsite = *callsite;
    d.layer = static_cast<int>(layer);
    d.phase = static_cast<probes::Phase>(phase);
    handle = sink->collectiveEnqueued(d, t);
    sink->collectiveState(handle, probes::CollectiveState::Started, t);
  }
  return true;
}

int programFrame(int& line) {
  Registry& r = Registry::instance();
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    int file = -1;
    auto it = r.programFiles.find(reinterpret_cast<PyObject*>(code));
    if (it != r.programFiles.end()) {
      file = it->second;
    } else {
      const char* path = PyUnicode_AsUTF8(code->co_filename);
      if (path == nullptr) {
        PyErr_Clear();
      } else {
        std::string_view p(path);
        bool foreign = false;
        for (const std::string& dir : r.foreignDirs) foreign = foreign || p.substr(0, dir.size()) == dir;
        if (!foreign) {
          const size_t slash = p.rfind('/');
          file = r.text(slash == std::string_view::npos ? p : p.substr(slash + 1));
        }
      }
      if (r.programFiles.size() < kMaxProgramFiles) {
        Py_INCREF(code);  // kept: a freed code object's address may be reused by another
        r.programFiles.emplace(reinterpret_cast<PyObject*>(code), file);
      }
    }
    Py_DECREF(code);
    if (file >= 0) {
      line = PyFrame_GetLineNumber(f);
      Py_DECREF(f);
      return file;
    }
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  return -1;
}

}  // namespace fastpath

void bindCollectiveFastPath(py::module_& m) {
  using namespace py::literals;
  Registry& r = Registry::instance();
  r.nameDtype = PyUnicode_InternFromString("dtype");
  r.nameShape = PyUnicode_InternFromString("shape");
  r.nameNbytes = PyUnicode_InternFromString("nbytes");
  r.nameDataPtr = PyUnicode_InternFromString("data_ptr");
  r.nameStorageOffset = PyUnicode_InternFromString("storage_offset");
  r.nameElementSize = PyUnicode_InternFromString("element_size");
  m.def(
      "intern_text", [](const std::string& s) { return Registry::instance().text(s); }, "text"_a,
      "The id of TEXT (an op or call-site name) for collective_issue, for the life of the process.");
  m.def(
      "collective_group",
      [](const std::string& name, const std::vector<int>& ranks) {
        Registry& reg = Registry::instance();
        if (auto it = reg.groupIds.find(name); it != reg.groupIds.end()) {
          reg.groups[static_cast<size_t>(it->second)].ranks = ranks;  // a name bound anew: its sequence goes on
          return it->second;
        }
        reg.groups.push_back(Group{name, ranks, 0});
        const int id = static_cast<int>(reg.groups.size()) - 1;
        reg.groupIds.emplace(name, id);
        return id;
      },
      "name"_a, "ranks"_a,
      "The id of tpscope group NAME (its global RANKS, updated when given anew) for collective_issue; its sequence "
      "numbers go on across calls.");
  m.def(
      "set_foreign_dirs",
      [](const std::vector<std::string>& dirs) {
        Registry& reg = Registry::instance();
        reg.foreignDirs = dirs;
        for (auto& [code, file] : reg.programFiles) Py_DECREF(code);  // each verdict is taken anew
        reg.programFiles.clear();
      },
      "dirs"_a, "Folders whose code program_frame passes over (torch's, tpscope's own).");
  for (PyMethodDef* def = kFastMethods; def->ml_name != nullptr; ++def) {
    PyObject* fn = PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr());
    if (fn == nullptr) throw py::error_already_set();
    m.attr(def->ml_name) = py::reinterpret_steal<py::object>(fn);
  }
}

}  // namespace tpscope::python
