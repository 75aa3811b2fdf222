// Single-process, torch-free tests of core's data path, config and LR schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "tpscope/core/data.h"
#include "tpscope/core/loss_scaler.h"
#include "tpscope/core/trainer.h"
#include "tpscope/rules/config.h"

namespace core = tpscope::core;
namespace rules = tpscope::rules;
namespace fs = std::filesystem;

namespace {
const std::string kSamples = TPSCOPE_SAMPLES_DIR;
}

TEST(ByteTokenizer, RoundTripsBytes) {
  const std::string s = "Tensor parallel\n\xc3\xa9t\xc3\xa9";
  auto ids = core::ByteTokenizer::encode(s);
  ASSERT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids[0], 'T');
  EXPECT_EQ(ids[ids.size() - 1], 0xa9);
  EXPECT_EQ(core::ByteTokenizer::decode(ids), s);
}

TEST(Corpus, SampleCorpusIsRealProseUnderTheSizeLimits) {
  auto c = core::Corpus::load(kSamples + "/corpus");
  EXPECT_GE(c.bytes().size(), 100000u);
  EXPECT_LE(c.bytes().size(), 4u * 1024 * 1024);
  for (const auto& f : c.files()) EXPECT_LT(fs::file_size(f), 2u * 1024 * 1024) << f;
  const std::string text(c.bytes().begin(), c.bytes().end());
  EXPECT_NE(text.find("the"), std::string::npos);
  EXPECT_THROW(core::Corpus::load("/nonexistent/corpus"), rules::ConfigError);
}

TEST(BatchSampler, DataParallelShardsEqualGradientAccumulation) {
  auto c = core::Corpus::load(kSamples + "/corpus");
  core::BatchSampler s(c, 16, 3, 42);
  const int64_t n = 16 * 3;
  std::vector<int64_t> a(n), at(n), b(n), bt(n);
  for (int64_t step = 1; step <= 3; ++step) {
    for (int k = 0; k < 2; ++k) {
      s.fill(step, k, 2, 0, 1, a.data(), at.data());   // dp = 1, grad_accum = 2, micro k
      s.fill(step, 0, 1, k, 2, b.data(), bt.data());   // dp = 2, grad_accum = 1, rank k
      EXPECT_EQ(a, b);
      EXPECT_EQ(at, bt);
    }
  }
  s.fill(1, 0, 1, 0, 1, a.data(), at.data());
  s.fill(1, 0, 1, 0, 1, b.data(), bt.data());
  EXPECT_EQ(a, b) << "deterministic";
  for (int64_t i = 0; i + 1 < 16; ++i) EXPECT_EQ(at[i], a[i + 1]) << "targets are the inputs shifted by one";
  s.fill(2, 0, 1, 0, 1, b.data(), bt.data());
  EXPECT_NE(a, b) << "another step reads other windows";
}

TEST(TrainConfig, ReadsTheSampleConfigsAndOverrides) {
  for (const char* name : {"tiny", "small", "bench"}) {
    auto c = rules::TrainConfig::fromFile(kSamples + "/configs/" + name + ".json");
    EXPECT_GT(c.layers, 0) << name;
    EXPECT_NO_THROW(c.validate(1, 1)) << name;
    EXPECT_NO_THROW(c.validate(2, 1)) << name;
    EXPECT_EQ(fs::path(c.corpusPath()), fs::path(kSamples + "/corpus").lexically_normal()) << name;
  }
  auto c = rules::TrainConfig::fromFile(kSamples + "/configs/tiny.json");
  c.set("layers", "3");
  c.set("sequence_parallel", "true");
  c.set("corpus", "/tmp/x");
  EXPECT_EQ(c.layers, 3);
  EXPECT_TRUE(c.sequence_parallel);
  EXPECT_EQ(c.corpus, "/tmp/x");
  EXPECT_THROW(c.set("layers", "2.5"), rules::ConfigError);
  EXPECT_THROW(c.set("no_such_key", "1"), rules::ConfigError);
}

TEST(TrainConfig, ValidateNamesTheValueThatDoesNotDivide) {
  auto c = rules::TrainConfig::fromFile(kSamples + "/configs/tiny.json");
  try {
    c.validate(8, 1);
    FAIL() << "heads = 4 at tp = 8 must be refused";
  } catch (const rules::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("heads = 4 is not divisible by tp = 8"), std::string::npos) << e.what();
  }
  c.ffn_hidden = 66;
  EXPECT_THROW(c.validate(4, 1), rules::ConfigError);
}

TEST(LearningRate, WarmupThenCosine) {
  rules::TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup = 10;
  c.steps = 110;
  EXPECT_DOUBLE_EQ(core::learningRate(c, 1), 0.1);
  EXPECT_DOUBLE_EQ(core::learningRate(c, 10), 1.0);
  EXPECT_NEAR(core::learningRate(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(core::learningRate(c, 110), 0.1, 1e-12);
}

// GradScaler's policy: halve on overflow (never below the floor), double after `window` clean steps in a row.
TEST(DynamicLossScaler, HalvesOnOverflowAndDoublesAfterACleanWindow) {
  core::DynamicLossScaler s(1024, 3, /*minScale=*/256);
  EXPECT_FALSE(s.update(1.5));
  EXPECT_FALSE(s.update(2.0));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(0.5));  // third clean step: grows
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_FALSE(s.update(1.0));
  EXPECT_TRUE(s.update(INFINITY));  // overflow: skip, halve, and the clean streak starts again
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.goodSteps(), 0);
  EXPECT_TRUE(s.update(NAN));
  EXPECT_TRUE(s.update(-INFINITY));
  EXPECT_TRUE(s.update(NAN));
  EXPECT_EQ(s.scale(), 256);  // the floor
  EXPECT_EQ(s.overflows(), 4);
  s.restore(8192, 2);
  EXPECT_FALSE(s.update(1.0));
  EXPECT_EQ(s.scale(), 16384);
}

TEST(TrainConfig, Fp16ImpliesDynamicLossScalingAndNeedsCuda) {
  auto c = rules::TrainConfig::fromFile(kSamples + "/configs/tiny.json");
  EXPECT_EQ(c.initialLossScale(), 0);  // off by default
  c.set("loss_scale", "4096");
  EXPECT_EQ(c.initialLossScale(), 4096);
  c.set("loss_scale", "0");
  c.set("fp16", "true");
  EXPECT_EQ(c.initialLossScale(), 65536);
  EXPECT_THROW(c.validate(1, 1), rules::ConfigError);  // device is cpu
  c.set("device", "cuda");
  EXPECT_NO_THROW(c.validate(1, 1));  // the config is fine; the mesh refuses when no GPU is visible
  c.set("bf16", "true");
  EXPECT_THROW(c.validate(1, 1), rules::ConfigError);
}

// Found by fuzz_config: an override that is not UTF-8 made the error message itself throw (nlohmann's dump), so
// tpscope-train died on an uncaught exception instead of printing one line. Such bytes are refused or kept.
TEST(TrainConfig, BytesThatAreNotUtf8GiveAClearErrorNotACrash) {
  auto c = rules::TrainConfig::fromFile(kSamples + "/configs/tiny.json");
  try {
    c.set("bf16", "\x8c\x8d\x82\xa4");
    FAIL() << "a bool key must refuse non-UTF-8 bytes";
  } catch (const rules::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected true or false"), std::string::npos) << e.what();
  }
  c.set("corpus", "/data/\xff\xfe");  // a path may be any bytes
  EXPECT_EQ(c.corpus, "/data/\xff\xfe");
  EXPECT_NO_THROW((void)c.toJson());
}

// Found by fuzz_config: a corpus name longer than the file system allows made validate() throw filesystem_error
// (exit 1, no key named) instead of the config error.
TEST(TrainConfig, ACorpusNameTooLongIsNotFoundNotAnException) {
  auto c = rules::TrainConfig::fromFile(kSamples + "/configs/tiny.json");
  c.set("corpus", "/tmp/" + std::string(300, 'x'));
  try {
    c.validate(1, 1);
    FAIL() << "the corpus does not exist";
  } catch (const rules::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("corpus not found"), std::string::npos) << e.what();
  }
}
