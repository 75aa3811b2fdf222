// The host half of tpscope._native's tensor checks (bindings.h): gradient health and the non-finite check of module
// outputs for tensors in CPU memory, read in one pass straight from the tensor's memory.
//
// Why not torch: on the CPU, torch reads every gradient twice for its health row (_foreach_norm, then aminmax) and
// sums every module output with a cascade sum, from Python, one call per tensor. These functions read each tensor once
// with the GIL released: per float32 element, the square into 8-lane float partial sums (folded into a double every
// 4,096 elements), the bits of |x| into a lane maximum (for a number that is not NaN, the bits of |x| order as |x|
// does) and a count of exponent-all-ones values (NaN or ±Inf). Only a tensor with such a value is read a second time,
// to split the count into NaN and Inf and to give the row what torch gives it (max |g| NaN where a NaN is present).
// Device tensors stay on torch's batched device path (_training, _modules): this is the CPU path only.
//
// Callers (tpscope/_host.py) pass (data_ptr, numel, dtype code) of contiguous CPU tensors they hold for the call;
// a wrong pointer is undefined behaviour, which is why the module is private.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace tpscope::python {

namespace {

enum class HostDtype : int { Float32 = 0, Float64 = 1, Float16 = 2, BFloat16 = 3 };

struct Buffer {
  const void* data = nullptr;
  int64_t numel = 0;
  HostDtype dtype = HostDtype::Float32;
};

struct Stats {
  double sumsq = 0;
  double maxAbs = 0;
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t nonfinite = 0;  // float32Pass: NaN and Inf together (the exponent test does not tell them apart)
};

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf or NaN
    const uint32_t bits = sign | 0x7f800000u | (mantissa << 13);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)  // subnormal or zero
                                        : std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

double load(const Buffer& b, int64_t i) {
  switch (b.dtype) {
    case HostDtype::Float32: return static_cast<const float*>(b.data)[i];
    case HostDtype::Float64: return static_cast<const double*>(b.data)[i];
    case HostDtype::Float16: return halfToFloat(static_cast<const uint16_t*>(b.data)[i]);
    case HostDtype::BFloat16: return bf16ToFloat(static_cast<const uint16_t*>(b.data)[i]);
  }
  return 0;
}

// float32, the common case: one vectorised pass with GCC/Clang vector extensions, kWidth bytes per vector (16: SSE2
// or NEON, the baseline; 32: AVX2, chosen at run time where the CPU has it), two vectors per iteration. Returns the
// sum of squares and max |x| of the finite case, and the number of values that are not finite.
template <int kWidth>
struct Vectors;
template <>
struct Vectors<16> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
};
template <>
struct Vectors<32> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
};

template <int kWidth>
[[gnu::always_inline]] inline Stats float32Pass(const float* p, int64_t n) {
  using F = typename Vectors<kWidth>::F;
  using I = typename Vectors<kWidth>::I;
  constexpr int kLanes = kWidth / 4;
  constexpr int64_t kStep = 2 * kLanes;
  constexpr int64_t kBlock = 4096;  // elements per float partial sum: a float lane sums at most 512 squares
  const I absMask = I{} + 0x7fffffff;
  const I expMask = I{} + 0x7f800000;
  Stats s;
  I maxBits0 = {}, maxBits1 = {};  // bits of |x|: below 0x7f800000 for finite values, so signed compares order them
  int64_t badCount = 0;
  int64_t i = 0;
  const int64_t vectorEnd = n - n % kStep;
  while (i < vectorEnd) {
    const int64_t blockEnd = std::min(vectorEnd, i + kBlock);
    F acc0 = {}, acc1 = {};
    I bad = {};  // minus the non-finite elements per lane (a vector compare gives -1 for true)
    for (; i < blockEnd; i += kStep) {
      F x0, x1;
      std::memcpy(&x0, p + i, sizeof x0);
      std::memcpy(&x1, p + i + kLanes, sizeof x1);
      I b0, b1;
      std::memcpy(&b0, &x0, sizeof b0);
      std::memcpy(&b1, &x1, sizeof b1);
      const I a0 = b0 & absMask, a1 = b1 & absMask;
      maxBits0 = a0 > maxBits0 ? a0 : maxBits0;
      maxBits1 = a1 > maxBits1 ? a1 : maxBits1;
      bad += ((b0 & expMask) == expMask) + ((b1 & expMask) == expMask);
      acc0 += x0 * x0;
      acc1 += x1 * x1;
    }
    const F acc = acc0 + acc1;
    double blockSum = 0;
    for (int k = 0; k < kLanes; ++k) {
      blockSum += acc[k];
      badCount -= bad[k];
    }
    s.sumsq += blockSum;
  }
  int32_t maxScalar = 0;
  for (int k = 0; k < kLanes; ++k) maxScalar = std::max({maxScalar, maxBits0[k], maxBits1[k]});
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    maxScalar = std::max(maxScalar, static_cast<int32_t>(bits & 0x7fffffffu));
    badCount += (bits & 0x7f800000u) == 0x7f800000u;
    s.sumsq += static_cast<double>(p[i]) * p[i];
  }
  float maxAbs;
  std::memcpy(&maxAbs, &maxScalar, sizeof maxAbs);
  s.maxAbs = maxAbs;
  s.nonfinite = badCount;  // split into NaN and Inf by the caller's second pass
  return s;
}

// Whether any float32 value is NaN or ±Inf: the exponent test alone.
template <int kWidth>
[[gnu::always_inline]] inline bool float32AnyNonfinite(const float* p, int64_t n) {
  using I = typename Vectors<kWidth>::I;
  constexpr int64_t kLanes = kWidth / 4;
  constexpr int64_t kStep = 4 * kLanes;
  const I expMask = I{} + 0x7f800000;
  I bad = {};
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    I b0, b1, b2, b3;  // one load each (a load of an array of them is split through the stack)
    std::memcpy(&b0, p + i, sizeof b0);
    std::memcpy(&b1, p + i + kLanes, sizeof b1);
    std::memcpy(&b2, p + i + 2 * kLanes, sizeof b2);
    std::memcpy(&b3, p + i + 3 * kLanes, sizeof b3);
    bad |= ((b0 & expMask) == expMask) | ((b1 & expMask) == expMask) | ((b2 & expMask) == expMask) |
           ((b3 & expMask) == expMask);
  }
  int32_t any = 0;
  for (int k = 0; k < kLanes; ++k) any |= bad[k];
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    any |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return any != 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
[[gnu::target("avx2")]] Stats float32PassAvx2(const float* p, int64_t n) { return float32Pass<32>(p, n); }
[[gnu::target("avx2")]] bool float32AnyNonfiniteAvx2(const float* p, int64_t n) {
  return float32AnyNonfinite<32>(p, n);
}
const bool kAvx2 = __builtin_cpu_supports("avx2");
Stats float32Stats(const float* p, int64_t n) { return kAvx2 ? float32PassAvx2(p, n) : float32Pass<16>(p, n); }
bool float32Nonfinite(const float* p, int64_t n) {
  return kAvx2 ? float32AnyNonfiniteAvx2(p, n) : float32AnyNonfinite<16>(p, n);
}
#else
Stats float32Stats(const float* p, int64_t n) { return float32Pass<16>(p, n); }
bool float32Nonfinite(const float* p, int64_t n) { return float32AnyNonfinite<16>(p, n); }
#endif

// Every other dtype (and the second pass): element by element in double.
Stats scalarPass(const Buffer& b) {
  Stats s;
  double sum[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < b.numel; ++i) {
    const double v = load(b, i);
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      s.maxAbs = std::max(s.maxAbs, std::fabs(v));
    }
    sum[i & 3] += v * v;
  }
  s.sumsq = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  return s;
}

// The row of one tensor: sum of squares (NaN or Inf as torch's norm gives), max |x| (NaN where a NaN is present,
// Inf where an Inf is), NaN count, Inf count.
Stats tensorStats(const Buffer& b) {
  if (b.dtype == HostDtype::Float32) {
    Stats s = float32Stats(static_cast<const float*>(b.data), b.numel);
    if (s.nonfinite == 0) return s;
  }
  Stats s = scalarPass(b);
  if (s.nan > 0) s.maxAbs = std::numeric_limits<double>::quiet_NaN();
  else if (s.inf > 0) s.maxAbs = std::numeric_limits<double>::infinity();
  return s;
}

Buffer toBuffer(const std::tuple<uintptr_t, int64_t, int>& t) {
  const auto [ptr, numel, dtype] = t;
  if (numel < 0) throw py::value_error("host buffer: negative element count");
  if (dtype < 0 || dtype > static_cast<int>(HostDtype::BFloat16))
    throw py::value_error("host buffer: dtype code " + std::to_string(dtype) + " is not 0-3");
  if (ptr == 0 && numel > 0) throw py::value_error("host buffer: null data pointer");
  return {reinterpret_cast<const void*>(ptr), numel, static_cast<HostDtype>(dtype)};
}

// [(sumsq, max_abs, nan_count, inf_count)] per buffer.
std::vector<std::tuple<double, double, int64_t, int64_t>> hostStats(
    const std::vector<std::tuple<uintptr_t, int64_t, int>>& buffers) {
  std::vector<Buffer> in;
  in.reserve(buffers.size());
  for (const auto& b : buffers) in.push_back(toBuffer(b));
  std::vector<std::tuple<double, double, int64_t, int64_t>> out(in.size());
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < in.size(); ++i) {
      const Stats s = tensorStats(in[i]);
      out[i] = {s.sumsq, s.maxAbs, s.nan, s.inf};
    }
  }
  return out;
}

// None when every value is finite; else the buffer's sum (NaN or ±Inf), as the engine's activation check reports.
std::optional<double> nonfiniteSum(const Buffer& b) {
  if (b.dtype == HostDtype::Float32 && !float32Nonfinite(static_cast<const float*>(b.data), b.numel))
    return std::nullopt;
  double sum = 0;
  bool bad = false;
  for (int64_t i = 0; i < b.numel; ++i) {
    const double v = load(b, i);
    bad = bad || !std::isfinite(v);
    sum += v;
  }
  if (!bad) return std::nullopt;
  return sum;
}

std::optional<double> hostNonfinite(uintptr_t ptr, int64_t numel, int dtype) {
  const Buffer b = toBuffer({ptr, numel, dtype});
  py::gil_scoped_release release;
  return nonfiniteSum(b);
}

}  // namespace

bool hostNonfiniteSum(const void* data, int64_t numel, int dtype, double* sum) {
  if (data == nullptr || numel <= 0 || dtype < 0 || dtype > static_cast<int>(HostDtype::BFloat16)) return false;
  const std::optional<double> s = nonfiniteSum({data, numel, static_cast<HostDtype>(dtype)});
  if (s) *sum = *s;
  return s.has_value();
}

void bindHostStats(py::module_& m) {
  using namespace py::literals;
  m.def("host_stats", &hostStats, "buffers"_a,
        "[(sum of squares, max |x|, NaN count, Inf count)] of each (data_ptr, numel, dtype code) buffer: contiguous "
        "CPU memory the caller holds; dtype 0 float32, 1 float64, 2 float16, 3 bfloat16. One pass per buffer, "
        "without the GIL.");
  m.def("host_nonfinite", &hostNonfinite, "data_ptr"_a, "numel"_a, "dtype"_a,
        "None when every value of the buffer is finite, else its sum (NaN or ±Inf).");
}

}  // namespace tpscope::python
