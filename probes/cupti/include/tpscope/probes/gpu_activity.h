// GPU activity (kernels, memcpy, memset, NCCL kernels) as spans, behind a small seam (after libkineto):
//
//   GpuActivitySource      where records come from: CUPTI (makeCuptiSource) or, in tests, a fake feeding synthetic
//                          records. Times are CLOCK_MONOTONIC ns (the CUPTI source makes CUPTI use that clock).
//   GpuCorrelator          pure logic: GPU record → its launch (runtime API record, same correlation id) → the
//                          innermost host span of the launching thread containing the launch time. Kind NcclKernel
//                          only when the kernel's name contains "nccl" (any case) AND a Comm span encloses its launch.
//   GpuActivityRecorder    glue: a FlushParticipant of the recorder that writes the resolved records as spans on a
//                          lane per stream (threads.kind "cuda-stream"), spans.correlation = the host span's id.
//
// Without a GPU (cuptiActivityEnable fails) the recorder logs ONE line and records host timers only.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime_hooks.h"

namespace tpscope::probes {

enum class GpuActivityKind : uint8_t {
  Kernel = 0,
  Memcpy = 1,
  Memset = 2,
  Launch = 3,  // the host-side runtime/driver API call that enqueued work (cudaLaunchKernel, cudaMemcpyAsync, ...)
};

struct GpuActivity {
  GpuActivityKind kind = GpuActivityKind::Kernel;
  int64_t startNs = 0;  // CLOCK_MONOTONIC ns (the source's contract); file ns once inside the correlator
  int64_t endNs = 0;
  uint32_t deviceId = 0;
  uint32_t streamId = 0;
  uint32_t correlationId = 0;  // a GPU record and the Launch that enqueued it share it
  int64_t threadId = 0;        // Launch only: Linux tid of the calling thread
  int64_t bytes = 0;           // Memcpy / Memset
  std::string name;            // kernel name; "memcpy HtoD", "memset"; API name for a Launch
};

class GpuActivitySource {
 public:
  using Callback = std::function<void(std::span<const GpuActivity>)>;
  virtual ~GpuActivitySource() = default;
  virtual std::string_view name() const = 0;
  // Starts delivering records to `callback` (from any thread, in batches). False when unavailable: reason() says
  // why, in one line, and nothing is left enabled.
  virtual bool enable(Callback callback) = 0;
  virtual void disable() = 0;
  // Delivers what is buffered so far before returning.
  virtual void flush() = 0;
  virtual std::string reason() const = 0;
  // Records the source itself lost (e.g. CUPTI buffers refused when the bound is reached).
  virtual uint64_t dropped() const { return 0; }
  // The host spans of each flush, before the flush pulls the source (flusher thread). CUPTI has no use for them;
  // the simulated device derives its activity from them.
  virtual void observeHostSpans(std::span<const HostSpanRef> spans) { (void)spans; }
};

// The CUPTI source; with TPSCOPE_HAVE_CUDA off, a source whose enable() fails ("built without CUDA").
std::unique_ptr<GpuActivitySource> makeCuptiSource();

// A simulated device, so that the whole GPU path — launch/kernel correlation, stream lanes, NCCL kernels inside
// their collectives, the device-lane breakdown, the viewer's device lanes — runs end to end on a machine without a
// GPU (tests, CI). From each flush's host spans of CPU threads it derives what a CUDA engine would have launched:
// each stretch of a compute/optimizer span's own time (outside the spans nested in it) launches one kernel
// ("sim_<phase>_kernel", stream 7) that runs from just after the launch to the stretch's end; every comm span
// launches "ncclDevKernel_<...>_sim" (stream 13) inside it; a data span's own time a host-to-device memcpy
// (stream 7). Its records go through the same correlator and writer as
// CUPTI's. Never a substitute for a GPU measurement: the device times are the host's.
std::unique_ptr<GpuActivitySource> makeSimulatedSource();


// ---------------------------------------------------------------------------------------------------------------
class GpuCorrelator {
 public:
  struct Options {
    int64_t graceNs = 2'000'000'000;        // how long a record may wait for its launch / enclosing Comm span
    int64_t hostWindowNs = 30'000'000'000;  // host spans kept for lookups (by end time, behind the newest)
    size_t maxHostSpans = size_t{1} << 20;
    size_t maxPending = size_t{1} << 20;    // GPU records waiting; beyond: dropped (counted)
  };
  struct Resolved {
    GpuActivity activity;  // times in file ns
    SpanKind kind = SpanKind::Kernel;
    std::optional<int64_t> hostSpan;  // spans.id of the innermost enclosing host span
    int32_t step = -1;
    int16_t layer = -1;
    Phase phase = Phase::None;
  };
  struct Stats {
    uint64_t correlated = 0, uncorrelated = 0, ncclKernels = 0, dropped = 0;
  };
  using ThreadOf = std::function<std::optional<uint32_t>(int64_t osTid)>;

  explicit GpuCorrelator(ThreadOf threadOf);
  GpuCorrelator(ThreadOf threadOf, Options options);

  // Host spans as the recorder wrote them (per thread in end order, as drained).
  void addHostSpans(std::span<const HostSpanRef> spans);
  // Records with times already in file ns. `nowNs`: file ns now (starts their grace period).
  void addActivities(std::span<const GpuActivity> records, int64_t nowNs);
  // Appends to `out` the records that are settled: correlated for good, or past their grace, or all if `final`.
  void resolve(int64_t nowNs, bool final, std::vector<Resolved>* out);
  size_t pending() const { return pending_.size(); }
  const Stats& stats() const { return stats_; }

 private:
  struct Launch {
    int64_t osTid = 0;
    int64_t timeNs = 0;
    int64_t seenNs = 0;
  };
  struct Pending {
    GpuActivity activity;
    int64_t seenNs = 0;
  };
  struct Lookup {
    const HostSpanRef* innermost = nullptr;
    bool insideComm = false;
  };
  Lookup find(uint32_t thread, int64_t t) const;
  void prune(int64_t nowNs);

  ThreadOf threadOf_;
  Options options_;
  std::unordered_map<uint32_t, std::deque<HostSpanRef>> hostSpans_;   // per thread, in end order
  size_t hostSpanCount_ = 0;
  int64_t newestEndNs_ = 0;
  std::unordered_map<uint32_t, Launch> launches_;  // by correlation id
  std::vector<Pending> pending_;
  Stats stats_;
};

// ---------------------------------------------------------------------------------------------------------------
class GpuActivityRecorder final : public FlushParticipant {
 public:
  struct Options {
    GpuCorrelator::Options correlator;
    size_t maxQueued = size_t{1} << 20;  // records received, not yet taken by a flush; beyond: dropped (counted)
  };
  struct Stats {
    uint64_t received = 0, written = 0, dropped = 0, correlated = 0, uncorrelated = 0, ncclKernels = 0;
  };

  explicit GpuActivityRecorder(std::unique_ptr<GpuActivitySource> source);
  GpuActivityRecorder(std::unique_ptr<GpuActivitySource> source, Options options);
  ~GpuActivityRecorder() override;  // stop()

  // Enables the source and joins the recorder's flushes. On failure logs one line ("GPU activity off: <reason>;
  // host timers only") and returns false; the recorder keeps recording host spans.
  bool start();
  // Flushes the source, disables it, writes every record received (correlated as far as known) and leaves the
  // recorder. Either order with probes::stop() keeps the records: the recorder's final flush pulls from the source.
  void stop();
  bool active() const { return active_; }
  const std::string& reason() const { return reason_; }
  Stats stats() const;

  void onFlush(FlushContext& context) noexcept override;

 private:
  void receive(std::span<const GpuActivity> records);

  std::unique_ptr<GpuActivitySource> source_;
  Options options_;
  std::atomic<bool> active_{false};
  std::atomic<bool> settleAll_{false};  // stop(): the next flush writes every pending record
  std::string reason_;
  mutable std::mutex mutex_;  // queue_ and stats_
  std::vector<GpuActivity> queue_;
  Stats stats_;
  // Flusher thread only.
  GpuCorrelator correlator_;
  std::vector<GpuActivity> taken_;
  std::vector<GpuCorrelator::Resolved> resolved_;
  std::unordered_map<uint64_t, uint32_t> lanes_;  // (device << 32 | stream) → lane thread id
  uint64_t sourceDroppedSeen_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// What an engine calls once after the recorder started: reads TPSCOPE_GPU_ACTIVITY — `auto` (the default: CUPTI
// when `deviceIsCuda`, else nothing), `cupti`, `simulated`, `off` — and starts a GpuActivityRecorder on that source.
// Returns it (the caller keeps it alive until probes::stop(); its records are pulled by the recorder's final flush),
// or null when nothing is to be recorded or the source is unavailable (one line on stderr says why). An unknown
// value is reported on stderr and treated as `off`.
std::unique_ptr<GpuActivityRecorder> startGpuActivityFromEnvironment(bool deviceIsCuda);

}  // namespace tpscope::probes
