// tpscope probe recorder runtime: the `Sink` behind the probe API (probes.h) for one process = one rank.
//
// What it does once started:
//  * hands each recording thread a bounded ThreadBuffer (SPSC ring; the hot path never locks or allocates);
//  * runs ONE background flusher thread that, at least every `flushInterval` (250 ms), drains the buffers, converts
//    raw ticks to ns since the file's epoch, interns site names and writes everything to DIR/rank-K.db through
//    tracedb::Writer in ONE transaction per flush (WAL: a committed flush survives SIGKILL);
//  * keeps collectives as a flight recorder (bounded ring; every state change is upserted at the next flush);
//  * queues grad/step stats, alerts and counters in bounded queues (overflow counted as records_dropped);
//  * writes recorder_stats rows (drops, flush latency, probe overhead) so a trace says what it did not see;
//  * dumps on normal exit, SIGTERM/SIGINT (dump, then the previous disposition), SIGUSR1 (dump, continue) and
//    flushNow();
//  * estimates this rank's clock offset to rank 0 through a KvStore (NTP-style, best of k) at start and at stop.
// Details, guarantees and figures: docs/recorder.md.
//
// Threading: every function here may be called from any thread, never from a signal handler. They never throw.
// One recording session per process at a time; start() after stop() starts a new session (a new file).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tpscope/probes/probes.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"
#include "tpscope/version.h"

namespace tpscope::probes {

// ---------------------------------------------------------------------------------------------------------------
// Shared key-value store (clock alignment). c10d's TCPStore is adapted to it by core/; TcpKvClient (tcp_store.h)
// implements it for tests and `tpscope capture`.
class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sets `key` to `value` (replacing). False on failure. Must not throw. Any thread.
  virtual bool set(std::string_view key, std::string_view value) noexcept = 0;
  // Blocks until `key` exists, then returns its value; nullopt after `timeout` or on failure. Must not throw.
  virtual std::optional<std::string> get(std::string_view key, std::chrono::milliseconds timeout) noexcept = 0;
};

// Result of one clock alignment. t_rank0 = t_local + offsetNs, both as unix-epoch ns (each rank's CLOCK_REALTIME
// read at its recorder's start, advanced by its steady clock). Rank 0 gets {0, 0}.
struct ClockOffset {
  int64_t offsetNs = 0;
  int64_t uncertaintyNs = 0;  // half the best round trip
  int rounds = 0;             // round trips completed (0: failed, the values are meaningless)
  bool ok() const { return rounds > 0; }
};

struct ClockAlignOptions {
  int rounds = 16;                             // round trips; the one with the smallest RTT wins
  std::chrono::milliseconds timeout{10'000};   // per wait; rank 0 skips a rank that does not show up in time
  std::string prefix = "tpscope/clock";        // key prefix; keys: <prefix>/<tag>/<rank>/<round>/{ping,pong}
};

// One alignment round across the whole job: EVERY rank in [0, worldSize) calls it with the same `tag` (e.g.
// "<run_id>/start"). Rank 0 answers the others' pings in rank order with its clock; rank r sends k pings and keeps
// the round trip with the smallest RTT: offset = T0 - (t1 + t2) / 2, uncertainty = (t2 - t1) / 2.
// `nowNs` is the local clock in unix ns (default: the recorder's clock, else CLOCK_REALTIME).
// Bounded: a client returns after about timeout + rounds × 1 s at worst; rank 0 after 2 × timeout + 50 ms per rank.
ClockOffset alignClock(KvStore& store, int rank, int worldSize, std::string_view tag,
                       const ClockAlignOptions& options = {}, int64_t (*nowNs)() = nullptr);

// ---------------------------------------------------------------------------------------------------------------
struct RuntimeOptions {
  std::filesystem::path outDir;        // required: the rank's file is outDir/rank-<rank>.db (the folder must exist)
  std::string runId;                   // meta run_id; empty: "<host>-<pid>-<start time>"
  tracedb::RankInfo rank;              // rank, worldSize, localRank (+ tp/dp, device); host and pid filled if empty
  std::optional<int64_t> epochUnixNs;  // wall-clock ns of time 0 in the file; default: now (start())
  std::chrono::milliseconds flushInterval{250};
  size_t collectiveRing = 4096;        // collectives kept in memory (flight recorder)
  size_t recordQueue = 1 << 16;        // grad stats, step stats, alerts, counters queued between two flushes
  bool overwrite = true;               // replace an existing rank file
  bool installSignalHandlers = true;   // SIGTERM, SIGINT, SIGUSR1 (see top)
  bool flushAtExit = true;             // stop() from atexit
  std::shared_ptr<KvStore> clockStore; // if set: clock alignment at start (background) and at stop()
  ClockAlignOptions clock;
  std::chrono::milliseconds clockEndTimeout{5'000};  // the alignment at stop() waits at most this per wait
  std::string tool = std::string(kToolName);  // meta tool
  // Tests only: ns added to the wall clock this rank reads, as if its host's clock were off by that much
  // (TPSCOPE_TEST_CLOCK_OFFSET_NS). The file's times move with it; clock alignment measures −offset.
  int64_t testClockOffsetNs = 0;
};

// The options a launcher passes through the environment, or nullopt when TPSCOPE_OUT is unset or empty:
//   TPSCOPE_OUT (folder, created if missing), TPSCOPE_RUN_ID, RANK, WORLD_SIZE, LOCAL_RANK (torchrun's names; where
//   RANK is unset, Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), TPSCOPE_EPOCH_NS, TPSCOPE_FLUSH_MS,
//   TPSCOPE_CLOCK_STORE ("host:port" of a TcpKvServer: clock alignment; TPSCOPE_TOKEN is presented to it),
//   TPSCOPE_HOSTNAME (the host name recorded, instead of gethostname()), TPSCOPE_TEST_CLOCK_OFFSET_NS (tests).
//   Without TPSCOPE_RUN_ID the run id comes from the launcher (SLURM_JOB_ID.SLURM_STEP_ID, torchrun's
//   TORCHELASTIC_RUN_ID with MASTER_ADDR:MASTER_PORT, or MASTER_ADDR:MASTER_PORT), the same on every rank of the job.
std::optional<RuntimeOptions> optionsFromEnvironment();

// Starts recording: creates the file, starts the flusher, installs the sink (detail::g_sink) and sets
// detail::g_recording. Error if already started or the file cannot be created (nothing is recording then).
tracedb::Status start(const RuntimeOptions& options);
// start(*optionsFromEnvironment()) when TPSCOPE_OUT is set; OK and not recording when it is not. Idempotent: OK
// when already started. A failure is also written to stderr as "tpscope recorder: cannot start: <why>" (the line
// `tpscope capture` looks for in a rank's log).
tracedb::Status startFromEnvironment();
bool started();

// Stops recording: clears g_recording, clock alignment at end (if a store is set), final flush, writes end_ns and
// exit_reason ("ok" unless set), closes the file. No-op when not started.
void stop(std::string_view exitReason = "ok");
// Writes everything recorded so far and returns once it is committed (or after 5 s). No-op when not started.
void flushNow();

// Rank coordinates known after start (tp/dp, device, host). rank, worldSize, localRank, pid, the clock and the
// start/end fields stay the runtime's (from start() or the environment). Written at the next flush.
void setRankInfo(const tracedb::RankInfo& info);
// meta key/value (e.g. "config" → the training config as JSON). Written at the next flush.
void setMeta(std::string_view key, std::string_view value);
// A process group with its backend (collectives register their group themselves, with backend "").
void putGroup(const tracedb::GroupInfo& group);
// Names the calling thread in the threads table (default: pthread_getname_np when it first records).
void setThreadName(std::string_view name);
// Whether the flusher publishes the threads' open spans (meta open_spans; default on). A process whose spans do not
// all go through SpanScope (the Python package's are timed in Python and emitted when they end) turns it off: a
// watcher would read "no span open" where one is.
void publishOpenSpans(bool on) noexcept;
// Uses `store` for clock alignment now (background) and at stop(). Replaces RuntimeOptions::clockStore.
void setClockStore(std::shared_ptr<KvStore> store);

struct RecorderStats {
  int64_t spansWritten = 0, spansDropped = 0;
  int64_t recordsWritten = 0, recordsDropped = 0;
  int64_t flushes = 0, flushNsMax = 0, flushNsTotal = 0;
  int64_t flushCpuNsTotal = 0;  // CPU time of the flusher thread inside flushes (load-independent cost)
  int64_t perSpanCostPs = 0;  // measured hot-path cost of one span, picoseconds
  std::optional<ClockOffset> clockStart, clockEnd;
};
// Counters of the current (or last) session, as of the last flush.
RecorderStats recorderStats();
// The rank file of the current (or last) session; empty if none.
std::filesystem::path outputPath();

}  // namespace tpscope::probes
