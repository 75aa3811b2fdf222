#include "tpscope/core/mesh.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "backend.h"
#if TPSCOPE_HAVE_NCCL  // a CUDA build of LibTorch (Debian's CPU build ships c10/cuda headers that do not compile)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace tpscope::core {

struct Mesh::StoreHolder {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

// The rank's GPU: LOCAL_RANK modulo the visible devices (one rank per GPU under torchrun), made the current device.
c10::Device selectGpu(int localRank) {
  if (!torch::cuda::is_available())
    throw std::invalid_argument(
        "device = cuda, but no CUDA device is visible to this rank (a LibTorch built without CUDA, no GPU, or "
        "CUDA_VISIBLE_DEVICES empty)");
  const auto index = static_cast<c10::DeviceIndex>(localRank % static_cast<int>(torch::cuda::device_count()));
#if TPSCOPE_HAVE_NCCL
  c10::cuda::set_device(index);
#endif
  return {c10::kCUDA, index};
}

int envInt(const char* name, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (required) throw std::invalid_argument(fmt::format("environment variable {} is not set (torchrun sets "
                                                          "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)",
                                                          name));
    return fallback;
  }
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0) throw std::invalid_argument(fmt::format("{}='{}' is not a rank number", name, v));
  return static_cast<int>(x);
}

// torchrun's variable, or Slurm's where srun started the rank without torchrun (RANK unset, SLURM_PROCID set).
const char* launcherVar(const char* torchrun, const char* slurm) {
  const char* rank = std::getenv("RANK");
  const char* procid = std::getenv("SLURM_PROCID");
  const bool useSlurm = (rank == nullptr || *rank == '\0') && procid != nullptr && *procid != '\0';
  return useSlurm ? slurm : torchrun;
}

}  // namespace

Mesh::~Mesh() = default;

c10d::Store* Mesh::store() const noexcept { return store_ ? store_->store.get() : nullptr; }

std::unique_ptr<Mesh> Mesh::single() {
  std::unique_ptr<Mesh> m(new Mesh());
  m->tpComm_ = Communicator::solo("tp-0", 0);
  m->dpComm_ = Communicator::solo("dp-0", 0);
  m->worldComm_ = Communicator::solo("world", 0);
  m->ppComm_ = Communicator::solo("pp-0", 0);
  m->embdComm_ = Communicator::solo("embd-0", 0);
  return m;
}

void Mesh::readDataReplica() {
  dataDpRank_ = dpRank();
  dataDp_ = dp_;
  const char* v = std::getenv("TPSCOPE_REPLAY_DP");
  if (v == nullptr || *v == '\0') return;
  int d = -1, n = 0, used = 0;
  if (std::sscanf(v, "%d/%d%n", &d, &n, &used) != 2 || v[used] != '\0' || n < 1 || d < 0 || d >= n)
    throw std::invalid_argument(fmt::format("TPSCOPE_REPLAY_DP='{}': expected d/D, the replica and the run's dp", v));
  if (dp_ != 1)
    throw std::invalid_argument(fmt::format(
        "TPSCOPE_REPLAY_DP='{}': a replica is replayed alone, on a mesh of dp 1 (this one has dp {})", v, dp_));
  dataDpRank_ = d;
  dataDp_ = n;
}

std::unique_ptr<Mesh> Mesh::fromEnvironment(const MeshOptions& opts) {
  if (opts.tp < 1 || opts.dp < 1 || opts.pp < 1)
    throw std::invalid_argument(fmt::format("tp={} dp={} pp={} must be >= 1", opts.tp, opts.dp, opts.pp));
  const int want = opts.tp * opts.dp * opts.pp;
  const std::string layout = opts.pp > 1 ? fmt::format("tp={} x dp={} x pp={}", opts.tp, opts.dp, opts.pp)
                                         : fmt::format("tp={} x dp={}", opts.tp, opts.dp);
  const char* worldVar = launcherVar("WORLD_SIZE", "SLURM_NTASKS");
  const char* rankVar = launcherVar("RANK", "SLURM_PROCID");
  const char* localVar = launcherVar("LOCAL_RANK", "SLURM_LOCALID");
  const char* ws = std::getenv(worldVar);
  if (ws == nullptr || *ws == '\0') {
    if (want != 1)
      throw std::invalid_argument(fmt::format("{} needs {} ranks, but WORLD_SIZE is not set: launch one "
                                              "process per rank (torchrun or tpscope capture)",
                                              layout, want));
    auto m = single();
    if (opts.cuda) m->device_ = selectGpu(envInt(localVar, 0, false));
    m->readDataReplica();
    return m;
  }
  const int world = envInt(worldVar, 1, true);
  const int rank = envInt(rankVar, 0, true);
  if (world != want) throw std::invalid_argument(fmt::format("WORLD_SIZE={} but {} = {}", world, layout, want));
  if (rank >= world) throw std::invalid_argument(fmt::format("RANK={} >= WORLD_SIZE={}", rank, world));
  std::unique_ptr<Mesh> m(new Mesh());
  m->rank_ = rank;
  m->tp_ = opts.tp;
  m->dp_ = opts.dp;
  m->pp_ = opts.pp;
  m->localRank_ = envInt(localVar, rank, false);
  m->readDataReplica();
  if (opts.cuda) m->device_ = selectGpu(m->localRank_);
  if (world == 1) {
    auto s = single();
    m->tpComm_ = std::move(s->tpComm_);
    m->dpComm_ = std::move(s->dpComm_);
    m->worldComm_ = std::move(s->worldComm_);
    m->ppComm_ = std::move(s->ppComm_);
    m->embdComm_ = std::move(s->embdComm_);
    return m;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') throw std::invalid_argument("environment variable MASTER_ADDR is not set");
  const int port = envInt("MASTER_PORT", 29500, true);
  if (port > 65535) throw std::invalid_argument(fmt::format("MASTER_PORT={} is not a port", port));

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0;
  so.numWorkers = static_cast<size_t>(world);
  so.waitWorkers = true;
  so.timeout = std::max(opts.timeout, opts.storeTimeout);
  m->store_ = std::make_shared<StoreHolder>();
  m->store_->store = c10::make_intrusive<c10d::TCPStore>(std::string(addr), so);

  const std::string a(addr);
  const bool loopback = a == "127.0.0.1" || a == "localhost" || a == "::1";
  auto makeComm = [&](const std::string& name, std::vector<int> members) {
    int groupRank = -1;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank) groupRank = static_cast<int>(i);
    if (members.size() == 1) return std::make_unique<Communicator>(name, members, 0, nullptr, opts.timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name + "/", m->store_->store);
    auto be = std::make_shared<Communicator::Backend>();
#if TPSCOPE_HAVE_NCCL
    if (opts.cuda) {
      be->pg = compat::makeNccl(prefixed, groupRank, static_cast<int>(members.size()), opts.timeout);
      be->gloo = false;
      be->device = m->device();
    }
#else
    if (opts.cuda) throw std::invalid_argument("this build has no NCCL: run on CPU (Gloo)");
#endif
    if (!be->pg) be->pg = compat::makeGloo(prefixed, groupRank, static_cast<int>(members.size()), opts.timeout, loopback);
    return std::make_unique<Communicator>(name, std::move(members), groupRank, be, opts.timeout);
  };

  std::vector<int> all(world);
  for (int i = 0; i < world; ++i) all[i] = i;
  m->worldComm_ = makeComm("world", all);
  // Megatron's order: TP fastest, then DP, then PP (mesh.h).
  const int stageBase = m->ppRank() * opts.tp * opts.dp;
  std::vector<int> tpMembers, dpMembers, ppMembers;
  for (int t = 0; t < opts.tp; ++t) tpMembers.push_back(stageBase + m->dpRank() * opts.tp + t);
  for (int d = 0; d < opts.dp; ++d) dpMembers.push_back(stageBase + d * opts.tp + m->tpRank());
  for (int s = 0; s < opts.pp; ++s) ppMembers.push_back(m->stageRank(s));
  // Groups are named by the job's coordinates: a replica replayed alone names them as the run did.
  const int job = m->jobRank(), jobInStage = job % (opts.tp * m->dataDp_);
  m->tpComm_ = makeComm(fmt::format("tp-{}", job / opts.tp), tpMembers);
  m->dpComm_ = makeComm(fmt::format("dp-{}", m->ppRank() * opts.tp + m->tpRank()), dpMembers);
  if (opts.pp > 1) {
    m->ppComm_ = makeComm(fmt::format("pp-{}", jobInStage), ppMembers);
    if (m->firstStage() || m->lastStage())
      m->embdComm_ = makeComm(fmt::format("embd-{}", jobInStage), {m->stageRank(0), m->stageRank(opts.pp - 1)});
    else
      m->embdComm_ = Communicator::solo(fmt::format("embd-{}", jobInStage), rank);
  } else {
    m->ppComm_ = Communicator::solo(fmt::format("pp-{}", jobInStage), rank);
    m->embdComm_ = Communicator::solo(fmt::format("embd-{}", jobInStage), rank);
  }
  return m;
}

}  // namespace tpscope::core
