// tpscope._autograd's module hooks: the global forward pre- and post-hook every nn.Module call runs
// (torch.nn.modules.module.register_module_forward_pre_hook / _forward_hook), as C callables in place of
// tpscope/_modules.py's _pre_hook and _post_hook while the C++ walk is the one in use. The Python hooks stay for the
// Python walk and hold the same rules.
//
// Why: samples/python/llama_tp.py makes 52 module calls a step, each a pre-hook (~8 µs of Python between matrix
// products that leave the caches cold) and a post-hook (~8 µs of Python around forward_done's pybind11 call of ten
// converted arguments): ~0.8 ms a step (bench/python/overhead_alternating.py --entries). Here the pre-hook looks the
// module up in _modules._infos and pushes the call on STATE.forward_stack; the post-hook pops it and calls
// forward_done directly, each ModuleInfo's numbers read once. What is rare stays in Python: a module not seen yet
// (_modules._info_of), a root call's start (on_root_forward), an output the check found (_modules._watched, looked
// up on the module at each finding: its one outlet, which tests wrap).
//
// Every function here holds the GIL.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <unordered_map>

#include "autograd_regions.h"

namespace py = pybind11;

namespace tpscope::python::regions {

namespace {

struct Hooks {
  PyObject* stack = nullptr;        // STATE.forward_stack: a list, only ever changed in place
  PyObject* infos = nullptr;        // _modules._infos: id(module) -> (module, ModuleInfo)
  PyObject* activations = nullptr;  // _modules._activations: the output check's findings since the last loss
  PyObject* modules = nullptr;      // tpscope._modules: WATCH, WALK and on_root_forward, read at each call
  PyObject* infoOf = nullptr;       // _modules._info_of(module) -> (module, ModuleInfo), for a module not seen yet
  PyObject* sWatched = nullptr;     // "_watched": _modules._watched(info, found), looked up when a finding comes
  Py_ssize_t activationLimit = 0;   // _modules._ACT_LIMIT: findings kept per step
  PyObject* sWatch = nullptr;
  PyObject* sWalk = nullptr;
  PyObject* sOnRootForward = nullptr;
  // A ModuleInfo's numbers (it is kept alive by _modules._numbered, so its address keeps naming it).
  struct Info {
    int number, fwdSite, bwdSite, layer;
    bool leaf;
  };
  std::unordered_map<PyObject*, Info> numbers;
  int64_t calls = 0;  // module calls so far: a call's index orders it against the others (the walk's regions)
};

Hooks* hooks = nullptr;  // set by hooks_setup; leaked, as it holds Python references past the interpreter's teardown

// The numbers of ModuleInfo INFO, or nullptr with an exception set.
const Hooks::Info* numbersOf(PyObject* info) {
  if (auto it = hooks->numbers.find(info); it != hooks->numbers.end()) return &it->second;
  Hooks::Info n{};
  const char* names[] = {"number", "fwd_site", "bwd_site", "layer"};
  int* fields[] = {&n.number, &n.fwdSite, &n.bwdSite, &n.layer};
  for (int i = 0; i < 4; ++i) {
    PyObject* v = PyObject_GetAttrString(info, names[i]);
    if (v == nullptr) return nullptr;
    *fields[i] = static_cast<int>(PyLong_AsLong(v));
    Py_DECREF(v);
    if (*fields[i] == -1 && PyErr_Occurred()) return nullptr;
  }
  PyObject* leaf = PyObject_GetAttrString(info, "leaf");
  if (leaf == nullptr) return nullptr;
  const int isLeaf = PyObject_IsTrue(leaf);
  Py_DECREF(leaf);
  if (isLeaf < 0) return nullptr;
  n.leaf = isLeaf != 0;
  return &hooks->numbers.emplace(info, n).first->second;
}

int flag(PyObject* name) {
  PyObject* v = PyObject_GetAttr(hooks->modules, name);
  if (v == nullptr) return -1;
  const int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  return t;
}

bool arguments(const char* hook, Py_ssize_t want, size_t nargsf, PyObject* kwnames) {
  if (hooks == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "%s: tpscope._autograd.hooks_setup was not called", hook);
    return false;
  }
  if (PyVectorcall_NARGS(nargsf) != want || kwnames != nullptr) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd positional arguments", hook, want);
    return false;
  }
  return true;
}

// pre_hook(module, inputs): the call's start, pushed on STATE.forward_stack as (module, ModuleInfo, t0, index).
PyObject* preHook(PyObject*, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (!arguments("pre_hook", 2, nargsf, kwnames)) return nullptr;
  if (!api().recording()) Py_RETURN_NONE;
  PyObject* module = args[0];
  PyObject* key = PyLong_FromVoidPtr(module);  // id(module)
  if (key == nullptr) return nullptr;
  PyObject* entry = PyDict_GetItemWithError(hooks->infos, key);  // borrowed
  Py_DECREF(key);
  if (entry == nullptr && PyErr_Occurred()) return nullptr;
  if (entry != nullptr && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 && PyTuple_GET_ITEM(entry, 0) == module)
    Py_INCREF(entry);
  else if ((entry = PyObject_CallOneArg(hooks->infoOf, module)) == nullptr)  // a module not seen yet: named there
    return nullptr;
  PyObject* info = PyTuple_GET_ITEM(entry, 1);
  if (PyList_GET_SIZE(hooks->stack) == 0) {  // a root call: _training's on_root_forward sees its inputs first
    PyObject* onRoot = PyObject_GetAttr(hooks->modules, hooks->sOnRootForward);
    PyObject* r = onRoot == nullptr || onRoot == Py_None ? nullptr : PyObject_CallOneArg(onRoot, args[1]);
    const bool failed = onRoot == nullptr || (onRoot != Py_None && r == nullptr);
    Py_XDECREF(onRoot);
    Py_XDECREF(r);
    if (failed) {
      Py_DECREF(entry);
      return nullptr;
    }
  }
  ++hooks->calls;
  PyObject* call = Py_BuildValue("(OOKL)", module, info, static_cast<unsigned long long>(api().ticks()),
                                 static_cast<long long>(hooks->calls));
  Py_DECREF(entry);
  if (call == nullptr) return nullptr;
  const int rc = PyList_Append(hooks->stack, call);
  Py_DECREF(call);
  if (rc < 0) return nullptr;
  Py_RETURN_NONE;
}

// post_hook(module, inputs, output): the call popped (with any a forward that raised left above it), then its span,
// output check and backward walk (forward_done); the walk's tables forgotten when it was the outermost call.
PyObject* postHook(PyObject*, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (!arguments("post_hook", 3, nargsf, kwnames)) return nullptr;
  PyObject* stack = hooks->stack;
  Py_ssize_t i = PyList_GET_SIZE(stack) - 1;
  auto moduleOf = [stack](Py_ssize_t k) {
    PyObject* call = PyList_GET_ITEM(stack, k);
    return PyTuple_Check(call) && PyTuple_GET_SIZE(call) == 4 ? PyTuple_GET_ITEM(call, 0) : nullptr;
  };
  while (i >= 0 && moduleOf(i) != args[0]) --i;
  if (i < 0) Py_RETURN_NONE;
  PyObject* call = PyList_GET_ITEM(stack, i);
  Py_INCREF(call);
  PyObject* info = PyTuple_GET_ITEM(call, 1);
  const unsigned long long t0 = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(call, 2));
  const long long index = PyLong_AsLongLong(PyTuple_GET_ITEM(call, 3));
  const Hooks::Info* n = PyErr_Occurred() ? nullptr : numbersOf(info);
  const int watch = n == nullptr ? -1 : flag(hooks->sWatch);
  const int walk = watch < 0 ? -1 : flag(hooks->sWalk);
  if (walk < 0 || PyList_SetSlice(stack, i, PyList_GET_SIZE(stack), nullptr) < 0) {
    Py_DECREF(call);
    return nullptr;
  }
  bool ok = false;
  try {
    py::object found =
        forwardDone(n->number, n->fwdSite, n->bwdSite, n->layer, index, t0, args[2], args[1],
                    watch && n->leaf && PyList_GET_SIZE(hooks->activations) < hooks->activationLimit, walk != 0);
    ok = found.is_none();
    if (!ok) {  // a non-finite sum, or an output to sum on its device
      PyObject* r = PyObject_CallMethodObjArgs(hooks->modules, hooks->sWatched, info, found.ptr(), nullptr);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
    if (ok && PyList_GET_SIZE(stack) == 0) endRootCall();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(call);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef kHookMethods[] = {
    {"pre_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&preHook)), METH_FASTCALL | METH_KEYWORDS,
     "pre_hook(module, inputs): tpscope/_modules.py's _pre_hook in C (the global forward pre-hook)."},
    {"post_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&postHook)), METH_FASTCALL | METH_KEYWORDS,
     "post_hook(module, inputs, output): tpscope/_modules.py's _post_hook with the C++ walk, in C (the global "
     "forward hook)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void bindModuleHooks(py::module_& m) {
  using namespace py::literals;
  m.def(
      "hooks_setup",
      [](py::list stack, py::dict infos, py::list activations, py::module_ modules, py::object infoOf,
         Py_ssize_t activationLimit) {
        auto* h = new Hooks();
        h->stack = stack.release().ptr();
        h->infos = infos.release().ptr();
        h->activations = activations.release().ptr();
        h->modules = modules.release().ptr();
        h->infoOf = infoOf.release().ptr();
        h->sWatched = PyUnicode_InternFromString("_watched");
        h->activationLimit = activationLimit;
        h->sWatch = PyUnicode_InternFromString("WATCH");
        h->sWalk = PyUnicode_InternFromString("WALK");
        h->sOnRootForward = PyUnicode_InternFromString("on_root_forward");
        if (hooks != nullptr) h->calls = hooks->calls;  // a second setup (tests): the calls' order goes on
        hooks = h;
      },
      "stack"_a, "infos"_a, "activations"_a, "modules"_a, "info_of"_a, "activation_limit"_a,
      "What pre_hook and post_hook read and call back into (tpscope/_modules.py's install).");
  for (PyMethodDef* def = kHookMethods; def->ml_name != nullptr; ++def) {
    PyObject* fn = PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr());
    if (fn == nullptr) throw py::error_already_set();
    m.attr(def->ml_name) = py::reinterpret_steal<py::object>(fn);
  }
}

}  // namespace tpscope::python::regions
