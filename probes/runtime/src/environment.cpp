// Start from the environment a launcher (tpscope capture, torchrun) sets.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
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
}  // namespace

std::optional<RuntimeOptions> optionsFromEnvironment() {
  const std::string out = env("TPSCOPE_OUT");
  if (out.empty()) return std::nullopt;
  RuntimeOptions o;
  o.outDir = out;
  o.runId = env("TPSCOPE_RUN_ID");
  const std::string rank = env("RANK"), world = env("WORLD_SIZE"), local = env("LOCAL_RANK");
  if (!rank.empty() && !parseInt(rank, &o.rank.rank)) warn("RANK=" + rank + " is not an integer; using 0");
  if (!world.empty() && !parseInt(world, &o.rank.worldSize)) warn("WORLD_SIZE=" + world + " is not an integer");
  if (!local.empty() && !parseInt(local, &o.rank.localRank)) warn("LOCAL_RANK=" + local + " is not an integer");
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
    std::shared_ptr<KvStore> store = TcpKvClient::connect(storeAddr, std::chrono::seconds(10), &error);
    if (store) {
      o->clockStore = std::move(store);
    } else {
      warn("TPSCOPE_CLOCK_STORE=" + storeAddr + ": " + error + "; clocks are not aligned");
    }
  }
  tracedb::Status s = start(*o);
  if (!s) warn("cannot start: " + s.message());
  return s;
}

}  // namespace tpscope::probes
