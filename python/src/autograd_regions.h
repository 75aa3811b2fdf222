// What autograd_regions.cpp (the backward spans' walk) offers module_hooks.cpp (the forward hooks) inside
// tpscope._autograd. Both with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "span_api.h"

namespace tpscope::python::regions {

// The recorder's functions, from tpscope._native's capsule (set when the module loads).
const SpanApi& api();
// A module call's forward returned: its span, the output check and the backward region's walk (forward_done).
pybind11::object forwardDone(int info, int fwdSite, int bwdSite, int layer, int64_t index, uint64_t t0,
                             pybind11::handle output, pybind11::handle inputs, bool watch, bool walk);
// The outermost module call returned (end_root_call).
void endRootCall();
// pre_hook, post_hook, hooks_setup (module_hooks.cpp).
void bindModuleHooks(pybind11::module_& m);

}  // namespace tpscope::python::regions
