// Mesh: rendezvous from torchrun's environment and the TP x DP x PP grid of process groups.
//
// Ranks come from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK (torchrun / Slurm launchers). Rank 0 hosts
// the c10d TCPStore. Layout (Megatron-LM's order): TP fastest, then DP, then PP —
//   global rank = pp_rank * (tp * dp) + dp_rank * tp + tp_rank,
// so a TP group is `tp` consecutive ranks (one node's fast links), a DP group holds the ranks of one stage with the
// same tp_rank, and a pipeline holds one rank per stage, tp * dp apart. Group names (index = the group's position):
//   "tp-<rank / tp>", "dp-<pp_rank * tp + tp_rank>", "pp-<dp_rank * tp + tp_rank>" (PP > 1 only),
//   "embd-<dp_rank * tp + tp_rank>" (PP > 1: the first and last stage's ranks, for the tied embedding), "world".
// With PP = 1 the TP and DP names are the TP x DP engine's ("tp-<dp_rank>", "dp-<tp_rank>").
// Pipeline neighbours talk point to point over the "pp-*" group (Communicator::send/recv). Backend: Gloo on CPU;
// NCCL when built with it and the run asks for CUDA.
// Without WORLD_SIZE in the environment a 1x1 mesh runs without any rendezvous.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

#include "tpscope/core/communicator.h"

namespace c10d {
class Store;
}

namespace tpscope::core {

struct MeshOptions {
  int tp = 1;
  int dp = 1;
  int pp = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // collective timeout (also Gloo's connect)
  std::chrono::milliseconds storeTimeout{std::chrono::minutes(5)};  // TCPStore rendezvous: never below `timeout`
  bool cuda = false;  // compute on the rank's GPU and communicate with NCCL instead of Gloo
};

class Mesh {
 public:
  // Throws std::invalid_argument (clear message) when WORLD_SIZE != tp * dp * pp, the environment is incomplete, or
  // TPSCOPE_REPLAY_DP is not d/D with 0 <= d < D on a mesh of dp 1.
  static std::unique_ptr<Mesh> fromEnvironment(const MeshOptions& opts);
  // A 1x1 mesh without rendezvous (single-process runs and tests).
  static std::unique_ptr<Mesh> single();
  ~Mesh();

  int rank() const noexcept { return rank_; }
  int worldSize() const noexcept { return tp_ * dp_ * pp_; }
  int tp() const noexcept { return tp_; }
  int dp() const noexcept { return dp_; }
  int pp() const noexcept { return pp_; }
  int tpRank() const noexcept { return rank_ % tp_; }
  int dpRank() const noexcept { return (rank_ / tp_) % dp_; }
  int ppRank() const noexcept { return rank_ / (tp_ * dp_); }
  bool firstStage() const noexcept { return ppRank() == 0; }
  bool lastStage() const noexcept { return ppRank() == pp_ - 1; }
  // The DP coordinates this rank draws its data, its dropout seed and its saved state for: its own, except in a replay
  // of one DP replica alone (`tpscope replay`: TPSCOPE_REPLAY_DP=d/D, read by fromEnvironment), where a job of dp 1
  // stands for replica d of the run's D. jobRank(): the run's rank this one stands for (its own rank otherwise).
  int dataDpRank() const noexcept { return dataDpRank_; }
  int dataDp() const noexcept { return dataDp_; }
  int jobRank() const noexcept { return (ppRank() * dataDp_ + dataDpRank_) * tp_ + tpRank(); }
  // The global rank of stage `stage` in this rank's pipeline (same tp_rank and dp_rank).
  int stageRank(int stage) const noexcept { return stage * tp_ * dp_ + rank_ % (tp_ * dp_); }
  int localRank() const noexcept { return localRank_; }
  Communicator& tpGroup() noexcept { return *tpComm_; }
  Communicator& dpGroup() noexcept { return *dpComm_; }
  Communicator& world() noexcept { return *worldComm_; }
  // This rank's pipeline (group rank = stage); one member at PP = 1.
  Communicator& ppGroup() noexcept { return *ppComm_; }
  // The first and last stage of this pipeline (the tied embedding's gradient); one member at PP = 1 and on the
  // middle stages.
  Communicator& embeddingGroup() noexcept { return *embdComm_; }
  // The rendezvous store (rank 0 hosts it); null for a mesh without rendezvous. Lives as long as the mesh.
  // c10d's TCPStore client is safe to share between threads (it serialises its operations).
  c10d::Store* store() const noexcept;
  // Where this rank computes: the CPU, or with MeshOptions::cuda the GPU LOCAL_RANK % (visible GPUs), made current.
  c10::Device device() const noexcept { return device_; }

 private:
  Mesh() = default;
  void readDataReplica();  // TPSCOPE_REPLAY_DP
  int rank_ = 0, tp_ = 1, dp_ = 1, pp_ = 1, localRank_ = 0;
  int dataDpRank_ = 0, dataDp_ = 1;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<Communicator> tpComm_, dpComm_, worldComm_, ppComm_, embdComm_;
  struct StoreHolder;
  std::shared_ptr<StoreHolder> store_;
};

}  // namespace tpscope::core
