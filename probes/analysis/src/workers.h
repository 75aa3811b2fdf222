// Internal: worker threads for the analyses: a large scan split by row id, or one analysis run alongside others. A
// worker reads through its own Reader of the same file (reader.h: one SQLite connection per thread), never through
// the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis::detail {

// Threads for `rows` rows of work: 1 below 500 k rows (a thread and a connection cost more than they save there),
// else the cores, at most 4. TPSCOPE_ANALYSIS_THREADS overrides the count (1: no worker threads).
unsigned workerCount(int64_t rows);

// Whether worker threads are on: more than one core, unless TPSCOPE_ANALYSIS_THREADS says 1.
bool workersOn();

// Splits the row ids [first, last] into `parts` consecutive ranges and calls scan(reader, from, to, part) for each
// (from and to included): part 0 on `reader` in the calling thread, the others in worker threads, each on its own
// Reader of reader.path(). Returns the first failure in part order. `scan` runs concurrently: it writes only its
// part's output.
using IdRangeScan = std::function<tracedb::Status(tracedb::Reader& reader, int64_t from, int64_t to, unsigned part)>;
tracedb::Status scanIdRanges(tracedb::Reader& reader, int64_t first, int64_t last, unsigned parts,
                             const IdRangeScan& scan);

// One analysis run alongside the caller's work: `task` runs on a worker thread with its own Reader of reader.path(),
// and get() waits for its result. Where worker threads are off, or the file does not open a second time, get() runs
// it in the calling thread on `reader`. The task only reads what it shares with the caller until get() returns.
template <class T>
class Concurrently {
 public:
  using Task = std::function<tracedb::Result<T>(tracedb::Reader& reader)>;

  Concurrently(tracedb::Reader& reader, Task task) : reader_(reader), task_(std::move(task)) {
    if (!workersOn()) return;
    thread_ = std::thread([this]() {
      if (auto own = tracedb::Reader::open(reader_.path())) result_ = task_(**own);
    });
  }
  ~Concurrently() {
    if (thread_.joinable()) thread_.join();
  }
  Concurrently(const Concurrently&) = delete;
  Concurrently& operator=(const Concurrently&) = delete;

  // Call once.
  tracedb::Result<T> get() {
    if (thread_.joinable()) thread_.join();
    return result_ ? std::move(*result_) : task_(reader_);
  }

 private:
  tracedb::Reader& reader_;
  Task task_;
  std::optional<tracedb::Result<T>> result_;  // written by the thread, read after the join
  std::thread thread_;
};

}  // namespace tpscope::analysis::detail
