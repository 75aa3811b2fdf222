// Start from the environment a launcher (tpscope capture, torchrun) sets.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>

#include "tpscope/probes/runtime.h"
#include "tpscope/probes/tcp_store.h"

namespace tpscope::probes {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

template <class T>
bool parseInt(const std::string& text, T* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') return false;
  *out = static_cast<T>(v);
  return true;
}

void warn(const std::string& what) { std::fprintf(stderr, "tpscope recorder: %s\n", what.c_str()); }

// One run id for every rank of a job that no tpscope capture started (merge refuses files of different runs, and the
// clock alignment keys on it): Slurm's job and step, else torchrun's rendezvous id with its store's address, else the
// store's address alone. "" when nothing identifies the job (the recorder then makes one of host, pid and time).
std::string launcherRunId() {
  const std::string slurmJob = env("SLURM_JOB_ID"), slurmStep = env("SLURM_STEP_ID");
  if (!slurmJob.empty()) return "slurm-" + slurmJob + (slurmStep.empty() ? "" : "." + slurmStep);
  const std::string addr = env("MASTER_ADDR"), port = env("MASTER_PORT"), rdzv = env("TORCHELASTIC_RUN_ID");
  if (addr.empty() || port.empty()) return {};
  const std::string where = addr + ":" + port;
  return rdzv.empty() ? "job-" + where : "torchrun-" + rdzv + "-" + where;
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

// Rank 0's clock store when no capture runs one (torchrun, srun): served for the life of the process, so the other
// ranks' alignment at their stop still finds it.
std::unique_ptr<TcpKvServer> g_jobClockStore;

// Without TPSCOPE_CLOCK_STORE: the job's own rendezvous address. Rank 0 serves a TcpKvServer at port MASTER_PORT + 1
// — on MASTER_ADDR when that is a loopback address, else on every interface and only with TPSCOPE_TOKEN as its
// token (every rank has it: torchrun and srun pass the environment on) — and every rank connects to it. Null (with
// a warning where something is missing) when it cannot be had.
std::shared_ptr<KvStore> jobClockStore(int rank, int worldSize) {
  const std::string addr = env("MASTER_ADDR"), portText = env("MASTER_PORT"), token = env("TPSCOPE_TOKEN");
  int port = 0;
  if (addr.empty() || !parseInt(portText, &port) || port < 1 || port > 65534) return nullptr;
  const bool loopback = isLoopback(addr);
  if (!loopback && token.empty()) {
    if (rank == 0)
      warn("clocks are not aligned across hosts: set TPSCOPE_TOKEN (the same secret on every node) so that rank 0 "
           "may serve the clock store at MASTER_ADDR:MASTER_PORT+1");
    return nullptr;
  }
  const auto storePort = static_cast<uint16_t>(port + 1);
  std::string error;
  if (rank == 0 && !g_jobClockStore) {
    // Every rank holds one connection for the whole run. Never fewer than the default: a store without a token
    // (loopback, no TPSCOPE_TOKEN) cannot tell a rank from a stranger, so a tight cap would let one lock it.
    TcpKvLimits limits;
    limits.maxClients = std::max(limits.maxClients, static_cast<size_t>(worldSize) + 16);
    g_jobClockStore = TcpKvServer::listen(loopback ? addr : std::string(), storePort, &error, token, limits);
    if (!g_jobClockStore) {
      warn("cannot serve the clock store on port " + std::to_string(storePort) + " (MASTER_PORT+1): " + error +
           "; clocks are not aligned");
      return nullptr;
    }
  }
  std::shared_ptr<KvStore> store =
      TcpKvClient::connect(rank == 0 && !loopback ? std::string("127.0.0.1") : addr, storePort,
                           std::chrono::seconds(20), &error, token);
  if (!store) warn("clock store at MASTER_ADDR:MASTER_PORT+1: " + error + "; clocks are not aligned");
  return store;
}
}  // namespace

std::optional<RuntimeOptions> optionsFromEnvironment() {
  const std::string out = env("TPSCOPE_OUT");
  if (out.empty()) return std::nullopt;
  RuntimeOptions o;
  o.outDir = out;
  o.runId = env("TPSCOPE_RUN_ID");
  if (o.runId.empty()) o.runId = launcherRunId();
  // torchrun's names; a rank srun started without torchrun has only Slurm's.
  const bool slurm = env("RANK").empty() && !env("SLURM_PROCID").empty();
  const char* rankName = slurm ? "SLURM_PROCID" : "RANK";
  const char* worldName = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const char* localName = slurm ? "SLURM_LOCALID" : "LOCAL_RANK";
  const std::string rank = env(rankName), world = env(worldName), local = env(localName);
  if (!rank.empty() && !parseInt(rank, &o.rank.rank)) warn(std::string(rankName) + "=" + rank + " is not an integer; using 0");
  if (!world.empty() && !parseInt(world, &o.rank.worldSize))
    warn(std::string(worldName) + "=" + world + " is not an integer");
  if (!local.empty() && !parseInt(local, &o.rank.localRank))
    warn(std::string(localName) + "=" + local + " is not an integer");
  o.rank.host = env("TPSCOPE_HOSTNAME");  // "": the recorder asks gethostname()
  const std::string skewText = env("TPSCOPE_TEST_CLOCK_OFFSET_NS");
  if (!skewText.empty() && !parseInt(skewText, &o.testClockOffsetNs))
    warn("TPSCOPE_TEST_CLOCK_OFFSET_NS=" + skewText + " is not an integer; ignored");
  if (o.rank.worldSize < 1) o.rank.worldSize = 1;
  o.rank.dpSize = o.rank.worldSize;  // until the engine says otherwise (setRankInfo)
  o.rank.dpRank = o.rank.rank;
  int64_t epoch = 0;
  const std::string epochText = env("TPSCOPE_EPOCH_NS");
  if (!epochText.empty()) {
    if (parseInt(epochText, &epoch) && epoch >= 0) {
      o.epochUnixNs = epoch;
    } else {
      warn("TPSCOPE_EPOCH_NS=" + epochText + " is not a non-negative integer; the epoch is the start time");
    }
  }
  int flushMs = 0;
  const std::string flushText = env("TPSCOPE_FLUSH_MS");
  if (!flushText.empty()) {
    if (parseInt(flushText, &flushMs) && flushMs > 0) {
      o.flushInterval = std::chrono::milliseconds(flushMs);
    } else {
      warn("TPSCOPE_FLUSH_MS=" + flushText + " is not a positive integer; using 250");
    }
  }
  return o;
}

tracedb::Status startFromEnvironment() {
  if (started()) return tracedb::Status::ok();
  std::optional<RuntimeOptions> o = optionsFromEnvironment();
  if (!o) return tracedb::Status::ok();
  std::error_code ec;
  std::filesystem::create_directories(o->outDir, ec);
  if (ec) {
    warn("cannot start: cannot create TPSCOPE_OUT=" + o->outDir.string() + ": " + ec.message());
    return tracedb::Status::error("tpscope recorder: cannot create TPSCOPE_OUT=" + o->outDir.string() + ": " +
                                  ec.message());
  }
  const std::string storeAddr = env("TPSCOPE_CLOCK_STORE");
  if (!storeAddr.empty() && o->rank.worldSize > 1) {
    std::string error;
    std::shared_ptr<KvStore> store =
        TcpKvClient::connect(storeAddr, std::chrono::seconds(10), &error, env("TPSCOPE_TOKEN"));
    if (store) {
      o->clockStore = std::move(store);
    } else {
      warn("TPSCOPE_CLOCK_STORE=" + storeAddr + ": " + error + "; clocks are not aligned");
    }
  } else if (o->rank.worldSize > 1) {
    o->clockStore = jobClockStore(o->rank.rank, o->rank.worldSize);
  }
  tracedb::Status s = start(*o);
  if (!s) warn("cannot start: " + s.message());
  return s;
}

}  // namespace tpscope::probes
