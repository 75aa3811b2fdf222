// What tpscope._native hands tpscope._autograd, in a capsule (tpscope._native._span_api): the recorder lives in
// _native alone (a static library linked once), and _autograd, which links LibTorch instead, records its spans
// through these plain function pointers. No pybind11 and no LibTorch here: both sides include it.
#pragma once

#include <cstdint>

#define TPSCOPE_SPAN_API_CAPSULE "tpscope._native._span_api"

namespace tpscope::python {

struct SpanApi {
  int version;  // kSpanApiVersion of the side that made it
  // The span site interned as `id` by tpscope._native.site(), stable for the life of the process, or nullptr when
  // there is none. Called with the GIL held (the site table is written only under it).
  const void* (*site)(int id);
  // Raw clock ticks, as tpscope._native.ticks(). Any thread.
  uint64_t (*ticks)();
  // One span [t0, t1] of `site` on the calling thread, when recording. Any thread, with or without the GIL.
  void (*emitSpan)(const void* site, uint64_t t0, uint64_t t1, int layer);
  // Whether the buffer of `numel` values at `data` (dtype code: 0 float32, 1 float64, 2 float16, 3 bfloat16) holds a
  // NaN or ±Inf, its sum then in *sum: the module-output check of tpscope._native.host_nonfinite, read in one pass.
  // Any thread; the caller keeps the memory alive.
  bool (*hostNonfinite)(const void* data, int64_t numel, int dtype, double* sum);
  // Whether the package's hooks record now: tpscope._native.recording(). With the GIL held.
  bool (*recording)();
};

inline constexpr int kSpanApiVersion = 3;

}  // namespace tpscope::python
