// The replica fingerprint (core/replica_check.h): its formula against an independent host computation, sensitivity
// to every single bit in fp32 and bf16, equality for equal tensors, distinct dtypes and shapes, and flipBit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <set>

#include "tpscope/core/replica_check.h"

namespace core = tpscope::core;

namespace {

// The multipliers of the documented formula, computed here on the host in uint64 (wrapping) arithmetic.
constexpr uint64_t kK1 = 0x9E3779B97F4A7C15ull, kK2 = 0xC2B2AE3D27D4EB4Full, kK3 = 0x94D049BB133111EBull;
constexpr uint64_t kChunk = 1u << 16;

uint64_t weight(uint64_t i) { return (2 * (i % kChunk) + 1) * kK1 * ((2 * (i / kChunk) + 1) * kK2); }

int64_t fp(const at::Tensor& t) { return core::fingerprint(t).item<int64_t>(); }

// The bits of a float as the formula reads them: the int32 pattern, sign-extended.
uint64_t bitsOf(float v) {
  int32_t i;
  std::memcpy(&i, &v, 4);
  return static_cast<uint64_t>(static_cast<int64_t>(i));
}

}  // namespace

TEST(Fingerprint, DifferenceOfTwoTensorsFollowsTheFormula) {
  // Same dtype and shape: the salt cancels, fp(a) - fp(b) = K3 · Σ (x_i - y_i) · w_i (mod 2^64).
  for (int64_t n : {int64_t{5}, int64_t{3 * kChunk + 7}}) {
    at::Tensor a = torch::randn({n});
    at::Tensor b = torch::randn({n});
    uint64_t expect = 0;
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) expect += (bitsOf(pa[i]) - bitsOf(pb[i])) * weight(static_cast<uint64_t>(i));
    expect *= kK3;
    EXPECT_EQ(static_cast<uint64_t>(fp(a)) - static_cast<uint64_t>(fp(b)), expect) << n << " elements";
  }
}

TEST(Fingerprint, EverySingleBitOfAnFp32AndABf16TensorChangesIt) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const at::Tensor base = torch::tensor({1.0f, -2.5f, 0.0f, 3.25f, 1e-3f, -7.0f}).to(dtype);
    std::set<int64_t> seen{fp(base)};
    const int bits = static_cast<int>(base.element_size() * 8);
    for (int64_t i = 0; i < base.numel(); ++i)
      for (int b = 0; b < bits; ++b) {
        at::Tensor t = base.clone();
        EXPECT_EQ(core::flipBit(t, i, b), b);
        EXPECT_FALSE(torch::equal(t.view(dtype == torch::kFloat ? torch::kInt : torch::kShort),
                                  base.view(dtype == torch::kFloat ? torch::kInt : torch::kShort)));
        EXPECT_TRUE(seen.insert(fp(t)).second) << "element " << i << " bit " << b << " of " << dtype;
      }
    EXPECT_EQ(seen.size(), static_cast<size_t>(1 + base.numel() * bits));
  }
}

TEST(Fingerprint, EqualTensorsAgreeWhateverTheirLayout) {
  const at::Tensor a = torch::randn({7, 9});
  EXPECT_EQ(fp(a), fp(a.clone()));
  const at::Tensor transposedTwice = a.t().contiguous().t();  // same values, another memory layout
  EXPECT_FALSE(transposedTwice.is_contiguous());
  EXPECT_EQ(fp(a), fp(transposedTwice));
  EXPECT_NE(fp(a), fp(a.t().contiguous()));  // another shape, other positions
}

TEST(Fingerprint, DtypeAndShapeAreDistinct) {
  const std::set<int64_t> fps{fp(torch::zeros({4})), fp(torch::zeros({4}, torch::kInt)),
                              fp(torch::zeros({4}, torch::kBFloat16)), fp(torch::zeros({2, 2})),
                              fp(torch::zeros({4, 1})), fp(torch::zeros({8}, torch::kBFloat16)),
                              fp(torch::zeros({}))};
  EXPECT_EQ(fps.size(), 7u);
}

TEST(Fingerprint, SwappedElementsDiffer) {
  const at::Tensor a = torch::tensor({1.0f, 2.0f, 3.0f});
  EXPECT_NE(fp(a), fp(torch::tensor({2.0f, 1.0f, 3.0f})));
}

TEST(FlipBit, TwiceRestoresTheTensorAndTheBitIsTakenModuloTheWidth) {
  at::Tensor t = torch::tensor({1.5f, 2.0f});
  const at::Tensor orig = t.clone();
  EXPECT_EQ(core::flipBit(t, 1, 31), 31);  // the sign bit
  EXPECT_EQ(t[1].item<float>(), -2.0f);
  EXPECT_EQ(core::flipBit(t, 1, 63), 31);  // 63 mod 32
  EXPECT_TRUE(torch::equal(t, orig));
  EXPECT_THROW(core::flipBit(t, 2, 0), c10::Error);
}
