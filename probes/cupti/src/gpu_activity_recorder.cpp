#include <cstdio>
#include <cstdlib>
#include <string>

#include "tpscope/probes/gpu_activity.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::probes {

GpuActivityRecorder::GpuActivityRecorder(std::unique_ptr<GpuActivitySource> source)
    : GpuActivityRecorder(std::move(source), Options{}) {}

GpuActivityRecorder::GpuActivityRecorder(std::unique_ptr<GpuActivitySource> source, Options options)
    : source_(std::move(source)),
      options_(options),
      correlator_([](int64_t tid) { return threadIdForOsTid(tid); }, options.correlator) {}

GpuActivityRecorder::~GpuActivityRecorder() { stop(); }

bool GpuActivityRecorder::start() {
  if (active_) return true;
  if (!source_) {
    reason_ = "no activity source";
  } else if (source_->enable([this](std::span<const GpuActivity> r) { receive(r); })) {
    addFlushParticipant(this);
    active_ = true;
    return true;
  } else {
    reason_ = source_->reason();
  }
  std::fprintf(stderr, "tpscope: GPU activity off: %s; recording host timers only\n", reason_.c_str());
  return false;
}

void GpuActivityRecorder::stop() {
  if (!active_) return;
  source_->flush();
  source_->disable();
  settleAll_ = true;
  flushNow();  // writes what the source just delivered, settled with what is known now
  removeFlushParticipant(this);
  settleAll_ = false;
  active_ = false;
}

GpuActivityRecorder::Stats GpuActivityRecorder::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void GpuActivityRecorder::receive(std::span<const GpuActivity> records) {
  std::lock_guard lock(mutex_);
  stats_.received += records.size();
  for (const GpuActivity& a : records) {
    if (queue_.size() >= options_.maxQueued) {
      ++stats_.dropped;
      continue;
    }
    queue_.push_back(a);
  }
}

void GpuActivityRecorder::onFlush(FlushContext& ctx) noexcept {
  try {
    if (source_) source_->observeHostSpans(ctx.hostSpans);
    if (ctx.final && source_) source_->flush();  // the last CUPTI buffers, before the file closes
    taken_.clear();
    uint64_t droppedBefore;
    {
      std::lock_guard lock(mutex_);
      taken_.swap(queue_);
      droppedBefore = stats_.dropped;
    }
    for (GpuActivity& a : taken_) {
      a.startNs = fileNsFromMonotonicNs(a.startNs);
      a.endNs = fileNsFromMonotonicNs(a.endNs);
    }
    const int64_t now = fileNsFromMonotonicNs(monotonicNs());
    correlator_.addHostSpans(ctx.hostSpans);
    const uint64_t correlatorDropped = correlator_.stats().dropped;
    correlator_.addActivities(taken_, now);
    resolved_.clear();
    correlator_.resolve(now, ctx.final || settleAll_.load(), &resolved_);

    std::vector<tracedb::SpanRow> rows;
    rows.reserve(resolved_.size());
    for (const auto& r : resolved_) {
      const uint64_t laneKey = uint64_t{r.activity.deviceId} << 32 | r.activity.streamId;
      auto lane = lanes_.find(laneKey);
      if (lane == lanes_.end()) {
        const std::string laneName =
            "cuda" + std::to_string(r.activity.deviceId) + " stream " + std::to_string(r.activity.streamId);
        const uint32_t id = registerLane(tracedb::thread_kinds::kCudaStream, laneName);
        lane = lanes_.emplace(laneKey, id).first;
        (void)ctx.writer.putThread(tracedb::ThreadInfo{ctx.rank, static_cast<int>(id),
                                                       std::string(tracedb::thread_kinds::kCudaStream), laneName});
      }
      auto name = ctx.writer.intern(r.activity.name);
      if (!name) continue;
      tracedb::SpanRow row;
      row.rank = ctx.rank;
      row.thread = static_cast<int>(lane->second);
      row.kind = static_cast<tracedb::SpanKind>(r.kind);
      row.name = *name;
      row.beginNs = r.activity.startNs;
      row.durNs = std::max<int64_t>(0, r.activity.endNs - r.activity.startNs);
      row.step = r.step;
      row.layer = r.layer;
      row.phase = static_cast<tracedb::Phase>(r.phase);
      row.correlation = r.hostSpan;
      rows.push_back(row);
    }
    const bool ok = rows.empty() || ctx.writer.addSpans(rows).isOk();
    const uint64_t sourceDropped = source_ ? source_->dropped() : 0;
    std::lock_guard lock(mutex_);
    const auto& cs = correlator_.stats();
    const uint64_t newDrops = (stats_.dropped - droppedBefore) + (cs.dropped - correlatorDropped);
    if (ok) {
      stats_.written += rows.size();
      *ctx.spansWritten += static_cast<int64_t>(rows.size());
    } else {
      *ctx.spansDropped += static_cast<int64_t>(rows.size());
    }
    *ctx.spansDropped += static_cast<int64_t>(newDrops);
    if (sourceDropped > sourceDroppedSeen_) {
      *ctx.spansDropped += static_cast<int64_t>(sourceDropped - sourceDroppedSeen_);
      sourceDroppedSeen_ = sourceDropped;
    }
    stats_.correlated = cs.correlated;
    stats_.uncorrelated = cs.uncorrelated;
    stats_.ncclKernels = cs.ncclKernels;
  } catch (...) {
    // Probes never throw; a failed batch shows up as fewer GPU spans (and in stats()).
  }
}

std::unique_ptr<GpuActivityRecorder> startGpuActivityFromEnvironment(bool deviceIsCuda) {
  const char* env = std::getenv("TPSCOPE_GPU_ACTIVITY");
  std::string mode = env && *env ? env : "auto";
  if (mode == "auto") mode = deviceIsCuda ? "cupti" : "off";
  std::unique_ptr<GpuActivitySource> source;
  if (mode == "cupti") {
    source = makeCuptiSource();
  } else if (mode == "simulated") {
    source = makeSimulatedSource();
  } else {
    if (mode != "off")
      std::fprintf(stderr, "tpscope: TPSCOPE_GPU_ACTIVITY=%s: expected auto, cupti, simulated or off; GPU activity off\n",
                   mode.c_str());
    return nullptr;
  }
  if (!started()) return nullptr;
  auto recorder = std::make_unique<GpuActivityRecorder>(std::move(source));
  if (!recorder->start()) return nullptr;  // it said why
  return recorder;
}

}  // namespace tpscope::probes
