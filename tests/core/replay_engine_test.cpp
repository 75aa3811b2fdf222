// What `tpscope replay` needs of the engine, in one process. The op check (core/op_check.h) on ATen operators run
// here: the operator that makes a NaN is named with its inputs; a constant written over memory that happened to hold
// NaN bits is not a finding. The mesh of a DP replica replayed alone (TPSCOPE_REPLAY_DP, core/mesh.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "tpscope/core/mesh.h"
#include "tpscope/core/op_check.h"

namespace core = tpscope::core;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A number as ATen makes one a tensor (type promotion of a C++ or Python number).
at::Tensor wrappedNumber(double x) {
  at::Tensor t = torch::scalar_tensor(x, torch::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

TEST(OpCheck, NamesTheOperatorThatMakesTheValue) {
  const at::Tensor zeros = torch::zeros({4});
  core::OpCheck check(0, 1, {}, {});
  check.stepBegin(1);
  const at::Tensor quotient = zeros / zeros;  // 0/0 from finite inputs
  check.stepEnd(1);
  ASSERT_TRUE(std::isnan(quotient[0].item<double>()));
  const auto& r = check.report();
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.op, "aten::div");
  EXPECT_TRUE(r.produced);
  EXPECT_EQ(r.carrier, -1);
  EXPECT_EQ(r.outputNan, 4);
}

TEST(OpCheck, AValueThatArrivesNamesItsInput) {
  at::Tensor x = torch::ones({3});
  x[1] = kNan;
  core::OpCheck check(0, 1, {}, {});
  check.stepBegin(1);
  const at::Tensor y = x * 2.0;
  check.stepEnd(1);
  ASSERT_TRUE(std::isnan(y[1].item<double>()));
  const auto& r = check.report();
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.op, "aten::mul");
  EXPECT_FALSE(r.produced);
  EXPECT_EQ(r.carrier, 0);
}

TEST(OpCheck, AConstantWrittenOverNanBitsIsNotAFinding) {
  // torch::tensor(x) and at::scalar_tensor write a number into fresh memory with copy_ or fill_; the memory may hold
  // NaN bits before (in a replay: one run in 30 under load, where the allocator handed back a freed NaN). A +Inf
  // number so written is a constant (isfinite's, a norm's order), as it is over memory that held anything else.
  at::Tensor copied = torch::full({}, kNan);
  at::Tensor filled = torch::full({}, kNan);
  const at::Tensor inf = wrappedNumber(kInf);
  core::OpCheck check(0, 1, {}, {});
  check.stepBegin(1);
  copied.copy_(inf);
  filled.fill_(kInf);
  check.stepEnd(1);
  EXPECT_TRUE(std::isinf(copied.item<double>()));
  EXPECT_TRUE(std::isinf(filled.item<double>()));
  EXPECT_FALSE(check.report().found) << check.report().op << " " << check.report().inputs;
  EXPECT_GE(check.report().opsChecked, 2);
}

// One process, no launcher: a mesh of 1 that stands for replica d of D. Its job rank is the run's rank of its place.
TEST(ReplayMesh, StandsForTheReplicaItReplays) {
  for (const char* v : {"WORLD_SIZE", "RANK", "SLURM_NTASKS", "SLURM_PROCID"}) unsetenv(v);
  {
    const auto own = core::Mesh::fromEnvironment({});
    EXPECT_EQ(own->dataDpRank(), 0);
    EXPECT_EQ(own->dataDp(), 1);
    EXPECT_EQ(own->jobRank(), 0);
  }
  setenv("TPSCOPE_REPLAY_DP", "2/3", 1);
  const auto m = core::Mesh::fromEnvironment({});
  EXPECT_EQ(m->dp(), 1);
  EXPECT_EQ(m->dataDpRank(), 2);
  EXPECT_EQ(m->dataDp(), 3);
  EXPECT_EQ(m->jobRank(), 2);  // tp 1, stage 0: the run's rank of replica 2
  for (const char* bad : {"3/3", "1", "-1/2", "1/0", "1/2x"}) {
    setenv("TPSCOPE_REPLAY_DP", bad, 1);
    EXPECT_THROW(core::Mesh::fromEnvironment({}), std::invalid_argument) << bad;
  }
  unsetenv("TPSCOPE_REPLAY_DP");
}

}  // namespace
