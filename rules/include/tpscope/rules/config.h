// TrainConfig: every knob of a training run, read from a JSON file (samples/configs/*.json) and overridden from
// the command line. Torch-free. Keys and defaults are documented in docs/config.md.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpscope::rules {

// A configuration problem the user can fix (bad key, bad value, a size that TP does not divide, missing corpus).
// tpscope-train turns it into exit code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainConfig {
  // model
  int64_t layers = 2, hidden = 64, heads = 4, ffn_hidden = 256, seq_len = 64, vocab_size = 256;
  double dropout = 0.0, attention_dropout = 0.0, label_smoothing = 0.0;
  // Targets equal to this byte (0-255; -1: none) do not count in the loss: padding. The loss is the mean over the
  // micro-batch's counted tokens, as torch's cross_entropy with ignore_index — a micro-batch with none is 0/0: NaN.
  int64_t loss_ignore_byte = -1;
  // batch / schedule
  int64_t micro_batch_size = 4, grad_accum = 1, steps = 20, warmup = 0;
  double lr = 1e-3, min_lr = 0.0, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8, clip = 1.0;
  uint64_t seed = 1234;
  // parallelism and memory
  bool sequence_parallel = false, activation_checkpointing = false, zero1 = false, bf16 = false;
  bool overlap_grad_reduce = true;
  double bucket_mb = 4.0;
  // pipeline parallelism (--pp P; the micro-batches of a step are grad_accum, alias --microbatches)
  std::string schedule = "1f1b";      // "gpipe", "1f1b" or "interleaved"
  int64_t virtual_stages = 1;         // model chunks per pipeline rank (interleaved only)
  std::vector<int64_t> pp_layers;     // layers per (virtual) stage, in stage order; empty: split evenly
  // precision and device
  bool fp16 = false;                 // fp16 autocast (CUDA only) with dynamic loss scaling
  double loss_scale = 0;             // initial dynamic loss scale; 0: off (fp16: 65536). Any precision, any device
  int64_t loss_scale_window = 2000;  // overflow-free steps before the scale doubles
  std::string device = "cpu";        // "cpu" (Gloo) or "cuda" (NCCL; the rank's GPU is LOCAL_RANK % device count)
  // runtime
  std::string corpus = "../corpus";  // file or folder of *.txt; relative to the config file's folder
  std::string checkpoint_dir;        // empty: no checkpoints
  int64_t save_every = 0;            // 0: only at the end when checkpoint_dir is set
  double timeout_s = 300;            // collective / rendezvous timeout
  int64_t threads = 1;               // intra-op threads per rank
  int64_t log_every = 1;

  std::string configDir = ".";       // folder of the config file, for relative paths

  // Throws ConfigError naming the file and the key.
  static TrainConfig fromFile(const std::string& path);
  // Sets one key from a JSON-typed string ("layers", "4"); unknown keys throw ConfigError.
  void set(const std::string& key, const std::string& jsonValue);
  // Checks sizes against the parallel layout; throws ConfigError naming the value that does not divide.
  void validate(int tp, int dp, int pp = 1) const;
  // Layers of each virtual stage (pp * virtual_stages entries, virtual stage = chunk * pp + stage): pp_layers, or
  // an even split (the first stages take one more when it does not divide). Assumes validate() passed.
  std::vector<int64_t> stageLayers(int pp) const;
  // The corpus path resolved against configDir.
  std::string corpusPath() const;
  // The initial dynamic loss scale in effect (loss_scale, or 65536 for fp16 without one); 0 when scaling is off.
  double initialLossScale() const { return loss_scale > 0 ? loss_scale : (fp16 ? 65536.0 : 0.0); }
  std::string toJson() const;
};

}  // namespace tpscope::rules
