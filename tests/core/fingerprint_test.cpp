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

TEST(FingerprintBatch, EqualsEachTensorsFingerprintAndReadsTheValuesAtEachCompute) {
  // Small tensors of four dtypes (hashed together by dtype), an empty one, a 0-dim one, and two over 2^16 elements
  // (one by one), interleaved.
  torch::manual_seed(7);
  std::vector<at::Tensor> ts = {torch::randn({512}),
                                torch::randn({70000}),
                                torch::randn({3, 5}).to(torch::kBFloat16),
                                torch::randint(-1000, 1000, {33}, torch::kLong),
                                torch::randn({0}),
                                torch::randn({}),
                                torch::rand({17}) > 0.5,
                                torch::randn({65536}),
                                torch::randn({65537}).to(torch::kBFloat16),
                                torch::randn({8, 8})};
  // Contiguous CPU tensors are hashed on the host; with a strided one among them the batch takes the operators an
  // accelerator runs (concatenation by dtype, one product, one segment sum): both must give fingerprint()'s values.
  const core::FingerprintBatch batch(ts);
  std::vector<at::Tensor> withStrided = ts;
  withStrided.push_back(torch::randn({400, 300}).t());  // 120,000 elements, not contiguous
  withStrided.push_back(torch::randn({20, 30}).t());
  const core::FingerprintBatch devicePath(withStrided);
  ASSERT_EQ(batch.size(), ts.size());
  auto expectEach = [&] {
    for (const auto* b : {&batch, &devicePath}) {
      const auto& list = b == &batch ? ts : withStrided;
      const at::Tensor got = b->compute();
      ASSERT_EQ(got.numel(), static_cast<int64_t>(list.size()));
      for (size_t i = 0; i < list.size(); ++i)
        EXPECT_EQ(got[static_cast<int64_t>(i)].item<int64_t>(), fp(list[i].contiguous())) << i;
    }
  };
  expectEach();
  // The tensors change in place (an optimizer step, a flipped bit): the next compute reads the new values.
  const at::Tensor before = batch.compute();
  core::flipBit(ts[0], 100, 3);
  ts[9].mul_(2);
  core::flipBit(ts[7], 65535, 0);
  const at::Tensor after = batch.compute();
  expectEach();
  EXPECT_NE(after[0].item<int64_t>(), before[0].item<int64_t>());
  EXPECT_NE(after[9].item<int64_t>(), before[9].item<int64_t>());
  EXPECT_NE(after[7].item<int64_t>(), before[7].item<int64_t>());
  EXPECT_EQ(after[1].item<int64_t>(), before[1].item<int64_t>());
  EXPECT_EQ(core::FingerprintBatch({}).compute().numel(), 0);
}

TEST(Fingerprint, TheHostPassAndTheOperatorsAgree) {
  // A contiguous CPU tensor is hashed in one host pass; a strided one through ATen's operators (the accelerator's
  // path): the same values give the same fingerprint, over several 2^16-element rows and a partial one, every width.
  torch::manual_seed(3);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kLong, torch::kChar}) {
    const at::Tensor strided = (torch::randn({700, 300}) * 100).to(dtype).t();
    ASSERT_FALSE(strided.is_contiguous());
    EXPECT_EQ(fp(strided), fp(strided.contiguous())) << dtype;
  }
}
