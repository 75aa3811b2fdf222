// The extension module tpscope._native (bindings.h).
#include "bindings.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "tpscope's probe recorder and health rules for Python programs (the same C++ code as tpscope-train's)";
  tpscope::python::bindRecorder(m);
  tpscope::python::bindHealth(m);
  tpscope::python::bindHostStats(m);
  tpscope::python::bindCollectiveFastPath(m);
  tpscope::python::bindFuncolFastPath(m);
}
