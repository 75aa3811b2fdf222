// Data: a byte-level tokenizer over a text corpus and deterministic, DP-sharded batches. Torch-free.
//
// Token ids are the corpus bytes (0..255); the model's vocab_size may be larger (padding so TP divides it).
// Sample k of the run is the window starting at offset hash(seed, k) mod (N - seq_len - 1); targets are the window
// shifted by one. The global micro-batch index of (step, micro, dp rank) is
//     g = ((step - 1) * grad_accum + micro) * dp + dp_rank
// and micro-batch g holds samples g * mbs .. g * mbs + mbs - 1. So dp = 2, grad_accum = 1 sees exactly the samples
// of dp = 1, grad_accum = 2 — the equivalence the DP tests rely on — and a resumed run sees the same data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpscope::core {

class Corpus {
 public:
  // `path`: a file, or a folder whose *.txt files are read in name order and joined with '\n'.
  // Throws ConfigError when it is missing, empty, or not long enough for one sample.
  static Corpus load(const std::string& path);
  const std::vector<uint8_t>& bytes() const noexcept { return bytes_; }
  const std::vector<std::string>& files() const noexcept { return files_; }

 private:
  std::vector<uint8_t> bytes_;
  std::vector<std::string> files_;
};

struct ByteTokenizer {
  static std::vector<int64_t> encode(const std::string& text);
  static std::string decode(const std::vector<int64_t>& ids);  // ids >= 256 become '?'
};

class BatchSampler {
 public:
  BatchSampler(const Corpus& corpus, int64_t seqLen, int64_t microBatch, uint64_t seed);
  // Fills ids/targets, each microBatch * seqLen int64 values (row-major [microBatch, seqLen]). step is 1-based.
  void fill(int64_t step, int64_t micro, int64_t gradAccum, int dpRank, int dp, int64_t* ids, int64_t* targets) const;
  int64_t tokensPerMicroBatch() const noexcept { return seqLen_ * microBatch_; }

 private:
  const Corpus* corpus_;
  int64_t seqLen_, microBatch_;
  uint64_t seed_;
};

}  // namespace tpscope::core
