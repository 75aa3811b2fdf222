#include "workers.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

namespace tpscope::analysis::detail {

namespace {

// TPSCOPE_ANALYSIS_THREADS, where it is a positive count.
std::optional<int> threadsSetting() {
  const char* env = std::getenv("TPSCOPE_ANALYSIS_THREADS");
  if (env == nullptr || std::atoi(env) <= 0) return std::nullopt;
  return std::atoi(env);
}

}  // namespace

bool workersOn() {
  if (auto n = threadsSetting()) return *n > 1;
  return std::thread::hardware_concurrency() > 1;
}

unsigned workerCount(int64_t rows) {
  if (auto n = threadsSetting()) return static_cast<unsigned>(std::min(*n, 16));
  if (rows < 500'000) return 1;
  return std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
}

tracedb::Status scanIdRanges(tracedb::Reader& reader, int64_t first, int64_t last, unsigned parts,
                             const IdRangeScan& scan) {
  if (parts <= 1) return scan(reader, first, last, 0);
  const int64_t chunk = (last - first + parts) / parts;
  auto from = [&](unsigned w) { return first + w * chunk; };
  auto to = [&](unsigned w) { return std::min(last, first + (w + 1) * chunk - 1); };
  std::vector<tracedb::Status> status(parts);
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < parts; ++w) {
    threads.emplace_back([&, w]() {
      auto own = tracedb::Reader::open(reader.path());
      if (!own) {
        status[w] = own.status();
        return;
      }
      status[w] = scan(**own, from(w), to(w), w);
    });
  }
  status[0] = scan(reader, from(0), to(0), 0);
  for (auto& t : threads) t.join();
  for (auto& s : status)
    if (!s) return s;
  return tracedb::Status::ok();
}

}  // namespace tpscope::analysis::detail
