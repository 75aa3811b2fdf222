#include "tpscope/core/data.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tpscope/rules/config.h"

namespace tpscope::core {

namespace fs = std::filesystem;

Corpus Corpus::load(const std::string& path) {
  Corpus c;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw rules::ConfigError(fmt::format("corpus not found: {}", path));
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw rules::ConfigError(fmt::format("corpus folder {} holds no *.txt files", path));
  } else {
    files.push_back(path);
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw rules::ConfigError(fmt::format("cannot read corpus file {}", f.string()));
    if (!c.bytes_.empty()) c.bytes_.push_back('\n');
    c.bytes_.insert(c.bytes_.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    c.files_.push_back(f.string());
  }
  if (c.bytes_.size() < 2) throw rules::ConfigError(fmt::format("corpus {} is empty", path));
  return c;
}

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string s(ids.size(), '?');
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= 0 && ids[i] < 256) s[i] = static_cast<char>(ids[i]);
  return s;
}

BatchSampler::BatchSampler(const Corpus& corpus, int64_t seqLen, int64_t microBatch, uint64_t seed)
    : corpus_(&corpus), seqLen_(seqLen), microBatch_(microBatch), seed_(seed) {
  if (static_cast<int64_t>(corpus.bytes().size()) < seqLen + 2)
    throw rules::ConfigError(fmt::format("corpus of {} bytes is shorter than seq_len + 1 = {}", corpus.bytes().size(),
                                  seqLen + 1));
}

void BatchSampler::fill(int64_t step, int64_t micro, int64_t gradAccum, int dpRank, int dp, int64_t* ids,
                        int64_t* targets) const {
  const auto& b = corpus_->bytes();
  const uint64_t span = b.size() - static_cast<uint64_t>(seqLen_) - 1;
  const int64_t g = ((step - 1) * gradAccum + micro) * dp + dpRank;
  for (int64_t i = 0; i < microBatch_; ++i) {
    uint64_t x = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(g * microBatch_ + i) + 0x632BE59BD9B4E019ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const uint64_t start = x % span;
    for (int64_t t = 0; t < seqLen_; ++t) {
      ids[i * seqLen_ + t] = b[start + t];
      targets[i * seqLen_ + t] = b[start + t + 1];
    }
  }
}

}  // namespace tpscope::core
