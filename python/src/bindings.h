// tpscope._native: the Python binding of the probe recorder (probes/runtime) and the live health rules
// (core/health_rules.h). A thin layer: every record goes through the same Sink as the C++ engine's, so Python and
// C++ ranks write the same rows at the same cost per record; nothing is re-implemented on the Python side.
//
// Threading: every function may be called from any Python thread. Only host_stats and host_nonfinite, which read
// whole tensors, release the GIL; every other call is far shorter than a GIL hand-over. None throws except where
// documented (bad arguments from Python: ValueError/TypeError).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace tpscope::probes {
struct Site;
}

namespace tpscope::python {

// start/stop, rank info, meta, groups, steps, ticks, span sites and spans, collectives, step stats, alerts, counters.
void bindRecorder(pybind11::module_& m);
// class Health: HealthRules + the grad_stats rows it checks.
void bindHealth(pybind11::module_& m);
// host_stats, host_nonfinite: gradient health and the non-finite check of tensors in CPU memory, in one pass.
void bindHostStats(pybind11::module_& m);
// intern_text, collective_group, collective_issue, collective_waited, program_frame, storage_key: the collective
// wrappers' hot path, on interned ids (collective_fastpath.cpp).
void bindCollectiveFastPath(pybind11::module_& m);
// Issue, set_state, where, callsite_id, funcol_setup, funcol_wrapper, funcol_wait_wrapper: the call site of a
// collective and the functional collectives' wrappers (funcol_fastpath.cpp).
void bindFuncolFastPath(pybind11::module_& m);

// Whether the DTYPE-coded (host_stats' codes: 0 float32, 1 float64, 2 float16, 3 bfloat16) buffer of NUMEL values at
// DATA holds a NaN or ±Inf, its sum then in *SUM (host_nonfinite without Python; the caller holds the memory).
bool hostNonfiniteSum(const void* data, int64_t numel, int dtype, double* sum);

// Whether the package's hooks record now: the recorder started and set_paused not set (recorder_binding.cpp).
bool packageRecording();

// The span site interned as ID by site() (recorder_binding.cpp), or nullptr.
const probes::Site* spanSite(int id);

}  // namespace tpscope::python
