#include <algorithm>
#include <cctype>

#include "tpscope/probes/gpu_activity.h"

namespace tpscope::probes {

namespace {

constexpr size_t kMaxScan = 4096;  // spans examined past the innermost candidate when looking for a Comm ancestor

bool nameSaysNccl(std::string_view name) {
  for (size_t i = 0; i + 4 <= name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(name[i])) == 'n' &&
        std::tolower(static_cast<unsigned char>(name[i + 1])) == 'c' &&
        std::tolower(static_cast<unsigned char>(name[i + 2])) == 'c' &&
        std::tolower(static_cast<unsigned char>(name[i + 3])) == 'l') {
      return true;
    }
  }
  return false;
}

SpanKind baseKind(GpuActivityKind k) {
  switch (k) {
    case GpuActivityKind::Memcpy: return SpanKind::Memcpy;
    case GpuActivityKind::Memset: return SpanKind::Memset;
    default: return SpanKind::Kernel;
  }
}

}  // namespace

GpuCorrelator::GpuCorrelator(ThreadOf threadOf) : GpuCorrelator(std::move(threadOf), Options{}) {}
GpuCorrelator::GpuCorrelator(ThreadOf threadOf, Options options)
    : threadOf_(std::move(threadOf)), options_(options) {}

void GpuCorrelator::addHostSpans(std::span<const HostSpanRef> spans) {
  for (const HostSpanRef& s : spans) {
    auto& list = hostSpans_[s.thread];
    if (list.empty() || list.back().endNs <= s.endNs) {
      list.push_back(s);
    } else {  // recorded out of end order (emitSpan with explicit times): keep the list sorted by end
      list.insert(std::upper_bound(list.begin(), list.end(), s.endNs,
                                   [](int64_t end, const HostSpanRef& h) { return end < h.endNs; }),
                  s);
    }
    ++hostSpanCount_;
    newestEndNs_ = std::max(newestEndNs_, s.endNs);
  }
}

void GpuCorrelator::addActivities(std::span<const GpuActivity> records, int64_t nowNs) {
  for (const GpuActivity& a : records) {
    if (a.kind == GpuActivityKind::Launch) {
      launches_[a.correlationId] = Launch{a.threadId, a.startNs, nowNs};
      continue;
    }
    if (pending_.size() >= options_.maxPending) {
      ++stats_.dropped;
      continue;
    }
    pending_.push_back(Pending{a, nowNs});
  }
}

GpuCorrelator::Lookup GpuCorrelator::find(uint32_t thread, int64_t t) const {
  Lookup out;
  auto it = hostSpans_.find(thread);
  if (it == hostSpans_.end()) return out;
  const auto& list = it->second;
  // Spans of a thread arrive in end order, so the first one at or after `t` that began by `t` is the innermost
  // (an inner span ends before the outer one); the ones after it that also began by `t` are its ancestors.
  auto pos = std::lower_bound(list.begin(), list.end(), t, [](const HostSpanRef& h, int64_t v) { return h.endNs < v; });
  for (size_t scanned = 0; pos != list.end() && scanned < kMaxScan; ++pos, ++scanned) {
    if (pos->beginNs > t) continue;
    if (out.innermost == nullptr) out.innermost = &*pos;
    if (pos->kind == SpanKind::Comm) {
      out.insideComm = true;
      break;
    }
  }
  return out;
}

void GpuCorrelator::resolve(int64_t nowNs, bool final, std::vector<Resolved>* out) {
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    Lookup found;
    auto launch = launches_.find(p.activity.correlationId);
    if (launch != launches_.end()) {
      if (const auto thread = threadOf_(launch->second.osTid)) found = find(*thread, launch->second.timeNs);
    }
    const bool ncclName = p.activity.kind == GpuActivityKind::Kernel && nameSaysNccl(p.activity.name);
    // Settled: the innermost span is known for good (later spans of that thread end later: none can be more inner);
    // an NCCL-named kernel also waits (within its grace) for an enclosing Comm span, which may end much later.
    const bool settled = (found.innermost != nullptr && (!ncclName || found.insideComm)) || final ||
                         nowNs - p.seenNs >= options_.graceNs;
    if (!settled) {
      if (keep != i) pending_[keep] = std::move(p);
      ++keep;
      continue;
    }
    Resolved r;
    r.activity = std::move(p.activity);
    r.kind = ncclName && found.insideComm ? SpanKind::NcclKernel : baseKind(r.activity.kind);
    if (found.innermost != nullptr) {
      r.hostSpan = found.innermost->id;
      r.step = found.innermost->step;
      r.layer = found.innermost->layer;
      r.phase = found.innermost->phase;
      ++stats_.correlated;
    } else {
      ++stats_.uncorrelated;
    }
    if (r.kind == SpanKind::NcclKernel) ++stats_.ncclKernels;
    out->push_back(std::move(r));
  }
  pending_.resize(keep);
  prune(nowNs);
}

void GpuCorrelator::prune(int64_t nowNs) {
  // Launches: kept for a grace period after they were seen (a graph launch's kernels share one correlation id).
  for (auto it = launches_.begin(); it != launches_.end();) {
    it = nowNs - it->second.seenNs > 2 * options_.graceNs ? launches_.erase(it) : std::next(it);
  }
  // Host spans: a window behind the newest, and a bound on their number.
  const int64_t cutoff = newestEndNs_ - options_.hostWindowNs;
  for (auto& [thread, list] : hostSpans_) {
    auto end = std::lower_bound(list.begin(), list.end(), cutoff,
                                [](const HostSpanRef& h, int64_t v) { return h.endNs < v; });
    size_t drop = static_cast<size_t>(end - list.begin());
    if (hostSpanCount_ > options_.maxHostSpans) {
      drop = std::max(drop, std::min(list.size(), hostSpanCount_ - options_.maxHostSpans));
    }
    if (drop > 0) {
      list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(drop));
      hostSpanCount_ -= drop;
    }
  }
}

}  // namespace tpscope::probes
