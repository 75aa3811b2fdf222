#include "tpscope/rules/config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tpscope::rules {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One table of keys: name -> (read from json, write to json). Keeps fromFile, set and toJson in step.
template <class F>
void forEachKey(TrainConfig& c, F&& f) {
  f("layers", c.layers); f("hidden", c.hidden); f("heads", c.heads); f("ffn_hidden", c.ffn_hidden);
  f("seq_len", c.seq_len); f("vocab_size", c.vocab_size); f("dropout", c.dropout);
  f("attention_dropout", c.attention_dropout); f("label_smoothing", c.label_smoothing);
  f("loss_ignore_byte", c.loss_ignore_byte);
  f("micro_batch_size", c.micro_batch_size); f("grad_accum", c.grad_accum); f("steps", c.steps);
  f("warmup", c.warmup); f("lr", c.lr); f("min_lr", c.min_lr); f("weight_decay", c.weight_decay);
  f("beta1", c.beta1); f("beta2", c.beta2); f("adam_eps", c.adam_eps); f("clip", c.clip); f("seed", c.seed);
  f("sequence_parallel", c.sequence_parallel); f("activation_checkpointing", c.activation_checkpointing);
  f("zero1", c.zero1); f("bf16", c.bf16); f("overlap_grad_reduce", c.overlap_grad_reduce);
  f("bucket_mb", c.bucket_mb); f("schedule", c.schedule); f("virtual_stages", c.virtual_stages);
  f("pp_layers", c.pp_layers); f("fp16", c.fp16); f("loss_scale", c.loss_scale);
  f("loss_scale_window", c.loss_scale_window); f("device", c.device); f("corpus", c.corpus);
  f("checkpoint_dir", c.checkpoint_dir);
  f("save_every", c.save_every); f("timeout_s", c.timeout_s); f("threads", c.threads); f("log_every", c.log_every);
}

// JSON text that never throws: bytes that are not UTF-8 (a path, a mistyped override) become U+FFFD.
std::string dumpText(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

template <class T>
void readInto(const json& v, T& out, const std::string& key, const std::string& where) {
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) throw std::runtime_error("expected true or false");
      out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw std::runtime_error("expected an integer");
      out = v.get<T>();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      if (!v.is_array()) throw std::runtime_error("expected a list of integers");
      std::vector<int64_t> list;
      for (const auto& x : v) {
        if (!x.is_number_integer()) throw std::runtime_error("expected a list of integers");
        list.push_back(x.get<int64_t>());
      }
      out = list;
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) throw std::runtime_error("expected a number");
      out = v.get<T>();
    } else {
      if (!v.is_string()) throw std::runtime_error("expected a string");
      out = v.get<std::string>();
    }
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: key \"{}\" = {}: {}", where, key, dumpText(v), e.what()));
  }
}

void applyObject(TrainConfig& c, const json& j, const std::string& where) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: the config must be a JSON object", where));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "name" || it.key() == "description") continue;
    bool known = false;
    forEachKey(c, [&](const char* name, auto& field) {
      if (it.key() == name) {
        readInto(it.value(), field, name, where);
        known = true;
      }
    });
    if (!known) throw ConfigError(fmt::format("{}: unknown key \"{}\" (see docs/config.md)", where, it.key()));
  }
}

void validatePipeline(const TrainConfig& c, int pp) {
  if (pp < 1) throw ConfigError(fmt::format("pp = {} must be >= 1", pp));
  if (c.schedule != "gpipe" && c.schedule != "1f1b" && c.schedule != "interleaved")
    throw ConfigError(fmt::format("config: schedule = \"{}\" must be \"gpipe\", \"1f1b\" or \"interleaved\"",
                                  c.schedule));
  if (c.virtual_stages < 1)
    throw ConfigError(fmt::format("config: virtual_stages = {} must be >= 1", c.virtual_stages));
  if (c.virtual_stages > 1 && c.schedule != "interleaved")
    throw ConfigError(fmt::format("config: virtual_stages = {} needs schedule = \"interleaved\"", c.virtual_stages));
  if (c.schedule == "interleaved") {
    if (pp < 2) throw ConfigError("config: schedule = \"interleaved\" needs pp >= 2");
    if (c.grad_accum % pp != 0)
      throw ConfigError(fmt::format("config: the interleaved schedule needs the micro-batches ({}) divisible by pp = {}",
                                    c.grad_accum, pp));
  }
  const int64_t stages = pp * c.virtual_stages;
  if (!c.pp_layers.empty()) {
    if (static_cast<int64_t>(c.pp_layers.size()) != stages)
      throw ConfigError(fmt::format("config: pp_layers has {} entries; pp x virtual_stages = {} needs one per stage",
                                    c.pp_layers.size(), stages));
    int64_t sum = 0;
    for (int64_t n : c.pp_layers) {
      if (n < 1) throw ConfigError(fmt::format("config: pp_layers entry {} must be >= 1", n));
      sum += n;
    }
    if (sum != c.layers)
      throw ConfigError(fmt::format("config: pp_layers sums to {} but layers = {}", sum, c.layers));
  } else if (c.layers < stages) {
    throw ConfigError(fmt::format("config: layers = {} is fewer than pp x virtual_stages = {} stages", c.layers,
                                  stages));
  }
}

}  // namespace

std::vector<int64_t> TrainConfig::stageLayers(int pp) const {
  if (!pp_layers.empty()) return pp_layers;
  const int64_t stages = pp * virtual_stages;
  std::vector<int64_t> out(static_cast<size_t>(stages), layers / stages);
  for (int64_t i = 0; i < layers % stages; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

TrainConfig TrainConfig::fromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot open config file {}", path));
  json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  TrainConfig c;
  applyObject(c, j, path);
  c.configDir = fs::absolute(fs::path(path)).parent_path().string();
  return c;
}

void TrainConfig::set(const std::string& key, const std::string& value) {
  json v;
  try {
    v = json::parse(value);
  } catch (const std::exception&) {
    v = value;  // a bare string such as a path
  }
  applyObject(*this, json{{key, v}}, "override");
}

void TrainConfig::validate(int tp, int dp, int pp) const {
  auto positive = [](const char* k, double v) {
    if (!(v > 0)) throw ConfigError(fmt::format("config: {} = {} must be positive", k, v));
  };
  positive("layers", layers); positive("hidden", hidden); positive("heads", heads); positive("ffn_hidden", ffn_hidden);
  positive("seq_len", seq_len); positive("vocab_size", vocab_size); positive("micro_batch_size", micro_batch_size);
  positive("grad_accum", grad_accum); positive("steps", steps); positive("lr", lr); positive("threads", threads);
  positive("timeout_s", timeout_s); positive("bucket_mb", bucket_mb);
  if (tp < 1 || dp < 1) throw ConfigError(fmt::format("tp = {} and dp = {} must be >= 1", tp, dp));
  if (hidden % heads != 0)
    throw ConfigError(fmt::format("config: hidden = {} is not divisible by heads = {}", hidden, heads));
  if (heads % tp != 0)
    throw ConfigError(fmt::format("config: heads = {} is not divisible by tp = {} (each rank needs whole heads)",
                                  heads, tp));
  if (ffn_hidden % tp != 0)
    throw ConfigError(fmt::format("config: ffn_hidden = {} is not divisible by tp = {}", ffn_hidden, tp));
  if (hidden % tp != 0) throw ConfigError(fmt::format("config: hidden = {} is not divisible by tp = {}", hidden, tp));
  if (vocab_size % tp != 0)
    throw ConfigError(fmt::format("config: vocab_size = {} is not divisible by tp = {}", vocab_size, tp));
  if (vocab_size < 256)
    throw ConfigError(fmt::format("config: vocab_size = {} is below 256, the byte-level tokenizer's alphabet",
                                  vocab_size));
  if (sequence_parallel && tp > 1 && seq_len % tp != 0)
    throw ConfigError(fmt::format("config: sequence_parallel needs seq_len = {} divisible by tp = {}", seq_len, tp));
  if (dropout < 0 || dropout >= 1 || attention_dropout < 0 || attention_dropout >= 1)
    throw ConfigError("config: dropout and attention_dropout must be in [0, 1)");
  if (label_smoothing < 0 || label_smoothing >= 1) throw ConfigError("config: label_smoothing must be in [0, 1)");
  if (loss_ignore_byte < -1 || loss_ignore_byte > 255)
    throw ConfigError(
        fmt::format("config: loss_ignore_byte = {} must be a byte (0-255) or -1 (none)", loss_ignore_byte));
  if (warmup < 0 || save_every < 0) throw ConfigError("config: warmup and save_every must be >= 0");
  if (device != "cpu" && device != "cuda")
    throw ConfigError(fmt::format("config: device = \"{}\" must be \"cpu\" or \"cuda\"", device));
  if (fp16 && bf16) throw ConfigError("config: fp16 and bf16 are both true; choose one");
  if (fp16 && device != "cuda")
    throw ConfigError("config: fp16 needs device = \"cuda\" (LibTorch's CPU autocast has only bf16: use bf16 = true)");
  if (!(loss_scale >= 0) || !std::isfinite(loss_scale))
    throw ConfigError(fmt::format("config: loss_scale = {} must be 0 (off) or a positive initial scale", loss_scale));
  if (loss_scale_window < 1)
    throw ConfigError(fmt::format("config: loss_scale_window = {} must be >= 1", loss_scale_window));
  validatePipeline(*this, pp);
  std::error_code ec;  // a name too long for the file system is "not found", not an exception
  if (!fs::exists(corpusPath(), ec))
    throw ConfigError(fmt::format("corpus not found: {} (config key \"corpus\" = \"{}\", resolved against {}); "
                                  "the sample corpus lives in samples/corpus",
                                  corpusPath(), corpus, configDir));
}

std::string TrainConfig::corpusPath() const {
  fs::path p(corpus);
  return (p.is_absolute() ? p : fs::path(configDir) / p).lexically_normal().string();
}

std::string TrainConfig::toJson() const {
  json j;
  TrainConfig copy = *this;
  forEachKey(copy, [&](const char* name, auto& field) { j[name] = field; });
  return dumpText(j);
}

}  // namespace tpscope::rules
