// The simulated device (gpu_activity.h): GPU activity derived from host spans, so the GPU path runs without a GPU.
#include <algorithm>
#include <string>
#include <vector>

#include "tpscope/probes/gpu_activity.h"
#include "tpscope/probes/runtime_hooks.h"

namespace tpscope::probes {

namespace {

constexpr uint32_t kComputeStream = 7, kNcclStream = 13;
constexpr int64_t kLaunchOffsetNs = 1'000;  // a launch 1 µs into its interval, 2 µs long
constexpr int64_t kLaunchDurNs = 2'000;
constexpr int64_t kQueueDelayNs = 3'000;    // the kernel starts 3 µs after its launch returns

class SimulatedSource final : public GpuActivitySource {
 public:
  std::string_view name() const override { return "simulated"; }
  bool enable(Callback callback) override {
    callback_ = std::move(callback);
    return true;
  }
  void disable() override { callback_ = nullptr; }
  void flush() override {}  // records are delivered as they are made, in observeHostSpans
  std::string reason() const override { return {}; }

  void observeHostSpans(std::span<const HostSpanRef> spans) override {
    if (!callback_ || spans.empty()) return;
    // File ns → CLOCK_MONOTONIC ns (the source contract), with the session's calibration as of now.
    const int64_t mono = monotonicNs();
    const int64_t offset = mono - fileNsFromMonotonicNs(mono);
    records_.clear();
    // By thread, then begin time, outer before inner, so the spans nested in one follow it. (A flush hands spans
    // over as the threads' rings held them: in end order.)
    sorted_.assign(spans.begin(), spans.end());
    std::sort(sorted_.begin(), sorted_.end(), [](const HostSpanRef& a, const HostSpanRef& b) {
      if (a.thread != b.thread) return a.thread < b.thread;
      if (a.beginNs != b.beginNs) return a.beginNs < b.beginNs;
      return a.endNs > b.endNs;
    });
    spans = sorted_;
    for (size_t i = 0; i < spans.size(); ++i) {
      const HostSpanRef& s = spans[i];
      if (s.kind == SpanKind::Comm) {
        launch(s, s.beginNs, s.endNs, offset, GpuActivityKind::Kernel, kNcclStream,
               "ncclDevKernel_AllReduce_Sum_f32_RING_LL_sim");
        continue;
      }
      const bool compute = s.kind == SpanKind::Compute || s.kind == SpanKind::Optimizer;
      if (!compute && s.kind != SpanKind::Data) continue;
      // The span's own time (not inside a span nested in it) is where it launched work: one kernel per gap.
      int64_t cursor = s.beginNs;
      for (size_t j = i + 1; j < spans.size() && spans[j].thread == s.thread && spans[j].beginNs < s.endNs; ++j) {
        if (spans[j].beginNs > cursor) gap(s, cursor, spans[j].beginNs, offset, compute);
        cursor = std::max(cursor, spans[j].endNs);
      }
      if (s.endNs > cursor) gap(s, cursor, s.endNs, offset, compute);
    }
    if (!records_.empty()) callback_(records_);
  }

 private:
  void gap(const HostSpanRef& s, int64_t from, int64_t to, int64_t offset, bool compute) {
    if (compute)
      launch(s, from, to, offset, GpuActivityKind::Kernel, kComputeStream,
             std::string("sim_") + std::string(phaseName(s.phase)) + "_kernel");
    else
      launch(s, from, to, offset, GpuActivityKind::Memcpy, kComputeStream, "memcpy HtoD");
  }

  // A launch 1 µs into [from, to) on the span's thread, and its device work from just after it to `to`.
  void launch(const HostSpanRef& s, int64_t from, int64_t to, int64_t offset, GpuActivityKind kind, uint32_t stream,
              std::string name) {
    if (to - from < kLaunchOffsetNs + kLaunchDurNs + kQueueDelayNs) return;
    std::optional<int64_t> tid = osTidForThreadId(s.thread);
    if (!tid) return;
    GpuActivity l;
    l.kind = GpuActivityKind::Launch;
    l.correlationId = ++correlation_;
    l.threadId = *tid;
    l.startNs = from + kLaunchOffsetNs + offset;
    l.endNs = l.startNs + kLaunchDurNs;
    l.name = kind == GpuActivityKind::Memcpy ? "cudaMemcpyAsync" : "cudaLaunchKernel";
    GpuActivity k;
    k.kind = kind;
    k.correlationId = l.correlationId;
    k.streamId = stream;
    // One stream runs one kernel at a time: a kernel starts no earlier than the previous one on its stream ended.
    int64_t& streamFree = stream == kNcclStream ? ncclFree_ : computeFree_;
    k.startNs = std::max(l.endNs + kQueueDelayNs, streamFree);
    k.endNs = std::max(k.startNs + 1, to + offset);
    streamFree = k.endNs;
    if (kind == GpuActivityKind::Memcpy) k.bytes = 4096;
    k.name = std::move(name);
    records_.push_back(std::move(l));
    records_.push_back(std::move(k));
  }

  Callback callback_;
  std::vector<GpuActivity> records_;
  std::vector<HostSpanRef> sorted_;
  uint32_t correlation_ = 0;
  int64_t computeFree_ = 0, ncclFree_ = 0;
};

}  // namespace

std::unique_ptr<GpuActivitySource> makeSimulatedSource() { return std::make_unique<SimulatedSource>(); }

}  // namespace tpscope::probes
