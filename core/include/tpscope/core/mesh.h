// Mesh: rendezvous from torchrun's environment and the TP x DP grid of process groups.
//
// Ranks come from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK (torchrun / Slurm launchers). Rank 0 hosts
// the c10d TCPStore. Layout: TP inner — global rank = dp_rank * tp + tp_rank, so a TP group is `tp` consecutive ranks
// (one node's fast links) and DP group j holds ranks {j, j + tp, j + 2 tp, ...}. Group names: "tp-<dp_rank>",
// "dp-<tp_rank>", "world". Backend: Gloo on CPU; NCCL when built with it and the run asks for CUDA.
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
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // collective timeout (also Gloo's connect)
  std::chrono::milliseconds storeTimeout{std::chrono::minutes(5)};  // TCPStore rendezvous: never below `timeout`
  bool cuda = false;  // compute on the rank's GPU and communicate with NCCL instead of Gloo
};

class Mesh {
 public:
  // Throws std::invalid_argument (clear message) when WORLD_SIZE != tp * dp or the environment is incomplete.
  static std::unique_ptr<Mesh> fromEnvironment(const MeshOptions& opts);
  // A 1x1 mesh without rendezvous (single-process runs and tests).
  static std::unique_ptr<Mesh> single();
  ~Mesh();

  int rank() const noexcept { return rank_; }
  int worldSize() const noexcept { return tp_ * dp_; }
  int tp() const noexcept { return tp_; }
  int dp() const noexcept { return dp_; }
  int tpRank() const noexcept { return rank_ % tp_; }
  int dpRank() const noexcept { return rank_ / tp_; }
  int localRank() const noexcept { return localRank_; }
  Communicator& tpGroup() noexcept { return *tpComm_; }
  Communicator& dpGroup() noexcept { return *dpComm_; }
  Communicator& world() noexcept { return *worldComm_; }
  // The rendezvous store (rank 0 hosts it); null for a mesh without rendezvous. Lives as long as the mesh.
  // c10d's TCPStore client is safe to share between threads (it serialises its operations).
  c10d::Store* store() const noexcept;
  // Where this rank computes: the CPU, or with MeshOptions::cuda the GPU LOCAL_RANK % (visible GPUs), made current.
  c10::Device device() const noexcept { return device_; }

 private:
  Mesh() = default;
  int rank_ = 0, tp_ = 1, dp_ = 1, localRank_ = 0;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<Communicator> tpComm_, dpComm_, worldComm_;
  struct StoreHolder;
  std::shared_ptr<StoreHolder> store_;
};

}  // namespace tpscope::core
