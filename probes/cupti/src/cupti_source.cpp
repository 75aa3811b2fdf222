// The CUPTI activity source (built only with the CUDA toolkit).
//
// Records: CONCURRENT_KERNEL, MEMCPY, MEMSET as GPU records; RUNTIME and DRIVER API calls that enqueue work
// (launches, memcpy, memset, graph launches) as Launch records carrying the calling thread's Linux tid
// (cuptiSetThreadIdType SYSTEM). CUPTI's timestamps are made CLOCK_MONOTONIC ns through
// cuptiActivityRegisterTimestampCallback (else shifted by an offset measured at enable()).
// Buffers: 4 MiB each, at most 32 outstanding; past that CUPTI is given no buffer and drops records, which are
// counted (refusals + cuptiActivityGetNumDroppedRecords).
// Every CUPTI call goes through TPS_CUPTI(...), which logs the failing call — or, inside enable(), keeps it as the
// reason, so that a machine without a GPU gets exactly one line (from GpuActivityRecorder::start).
#include <cupti.h>
#include <cxxabi.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tpscope/probes/gpu_activity.h"

namespace tpscope::probes {

namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr int kMaxBuffers = 32;

uint64_t monotonicTimestamp() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;
  std::string out(d);
  std::free(d);
  return out;
}

const char* copyKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

// The one way this file calls CUPTI: a failing call is logged with its text (CuptiSource::check).
#define TPS_CUPTI(call) check((call), #call)

class CuptiSource;
CuptiSource* g_source = nullptr;  // CUPTI's activity callbacks are process-wide
std::mutex g_sourceMutex;

class CuptiSource final : public GpuActivitySource {
 public:
  ~CuptiSource() override { disable(); }
  std::string_view name() const override { return "cupti"; }
  std::string reason() const override { return reason_; }
  uint64_t dropped() const override { return dropped_.load(); }

  bool enable(Callback callback) override {
    std::lock_guard lock(g_sourceMutex);
    if (enabled_) return true;
    if (g_source != nullptr) {
      reason_ = "another CUPTI source is already enabled in this process";
      return false;
    }
    callback_ = std::move(callback);
    quiet_ = true;
    reason_.clear();
    bool ok = TPS_CUPTI(cuptiActivityRegisterCallbacks(&bufferRequested, &bufferCompleted));
    if (ok) ok = TPS_CUPTI(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
    if (ok) {
      if (cuptiActivityRegisterTimestampCallback(&monotonicTimestamp) == CUPTI_SUCCESS) {
        clockShift_ = 0;
      } else {  // older CUPTI: measure its clock against ours once
        uint64_t cupti = 0;
        const uint64_t before = monotonicTimestamp();
        ok = TPS_CUPTI(cuptiGetTimestamp(&cupti));
        const uint64_t after = monotonicTimestamp();
        clockShift_ = static_cast<int64_t>(cupti) - static_cast<int64_t>(before + (after - before) / 2);
      }
    }
    g_source = this;
    for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                    CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME,
                                    CUPTI_ACTIVITY_KIND_DRIVER}) {
      if (!ok) break;
      ok = TPS_CUPTI(cuptiActivityEnable(kind));
      if (ok) enabledKinds_.push_back(kind);
    }
    quiet_ = false;
    if (!ok) {
      for (CUpti_ActivityKind kind : enabledKinds_) cuptiActivityDisable(kind);  // quietly: we already failed
      enabledKinds_.clear();
      g_source = nullptr;
      callback_ = nullptr;
      return false;
    }
    enabled_ = true;
    return true;
  }

  void disable() override {
    std::lock_guard lock(g_sourceMutex);
    if (!enabled_) return;
    TPS_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    for (CUpti_ActivityKind kind : enabledKinds_) TPS_CUPTI(cuptiActivityDisable(kind));
    enabledKinds_.clear();
    enabled_ = false;
    g_source = nullptr;
  }

  void flush() override {
    if (enabled_) TPS_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  }

 private:
  // Evaluates a CUPTI call (through TPS_CUPTI); on failure logs it (or, in quiet mode, keeps the first failure as
  // the reason).
  bool check(CUptiResult result, const char* call) {
    if (result == CUPTI_SUCCESS) return true;
    const char* text = nullptr;
    cuptiGetResultString(result, &text);
    std::string message = std::string(call) + " failed: " + (text ? text : "unknown CUPTI error");
    if (quiet_) {
      if (reason_.empty()) reason_ = std::move(message);
    } else {
      std::fprintf(stderr, "tpscope cupti: %s\n", message.c_str());
    }
    return false;
  }

  static void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
    *maxRecords = 0;
    CuptiSource* self = g_source;
    if (self == nullptr || self->outstanding_.fetch_add(1) >= kMaxBuffers) {
      if (self != nullptr) {
        self->outstanding_.fetch_sub(1);
        self->dropped_.fetch_add(1);  // at least one record will be lost; CUPTI counts the rest
      }
      *buffer = nullptr;
      *size = 0;
      return;
    }
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;
    if (*buffer == nullptr) self->outstanding_.fetch_sub(1);
  }

  static void CUPTIAPI bufferCompleted(CUcontext context, uint32_t streamId, uint8_t* buffer, size_t,
                                       size_t validSize) {
    CuptiSource* self = g_source;
    if (self != nullptr) self->parse(context, streamId, buffer, validSize);
    std::free(buffer);
    if (self != nullptr) self->outstanding_.fetch_sub(1);
  }

  bool isLaunchApi(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    const uint64_t key = uint64_t(domain) << 32 | cbid;
    auto it = launchApi_.find(key);
    if (it != launchApi_.end()) return it->second;
    const char* name = nullptr;
    cuptiGetCallbackName(domain, cbid, &name);
    const bool launch = name != nullptr && (std::strstr(name, "aunch") || std::strstr(name, "emcpy") ||
                                            std::strstr(name, "emset"));
    launchApi_.emplace(key, launch);
    return launch;
  }

  void parse(CUcontext context, uint32_t streamId, uint8_t* buffer, size_t validSize) {
    std::vector<GpuActivity> out;
    CUpti_Activity* record = nullptr;
    auto t = [this](uint64_t ts) { return static_cast<int64_t>(ts) - clockShift_; };
    while (cuptiActivityGetNextRecord(buffer, validSize, &record) == CUPTI_SUCCESS) {
      GpuActivity a;
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          a.kind = GpuActivityKind::Kernel;
          a.startNs = t(k->start);
          a.endNs = t(k->end);
          a.deviceId = k->deviceId;
          a.streamId = k->streamId;
          a.correlationId = k->correlationId;
          a.name = demangle(k->name);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          a.kind = GpuActivityKind::Memcpy;
          a.startNs = t(m->start);
          a.endNs = t(m->end);
          a.deviceId = m->deviceId;
          a.streamId = m->streamId;
          a.correlationId = m->correlationId;
          a.bytes = static_cast<int64_t>(m->bytes);
          a.name = copyKindName(m->copyKind);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          a.kind = GpuActivityKind::Memset;
          a.startNs = t(m->start);
          a.endNs = t(m->end);
          a.deviceId = m->deviceId;
          a.streamId = m->streamId;
          a.correlationId = m->correlationId;
          a.bytes = static_cast<int64_t>(m->bytes);
          a.name = "memset";
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(record);
          const auto domain = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                          : CUPTI_CB_DOMAIN_DRIVER_API;
          if (!isLaunchApi(domain, api->cbid)) continue;
          a.kind = GpuActivityKind::Launch;
          a.startNs = t(api->start);
          a.endNs = t(api->end);
          a.correlationId = api->correlationId;
          a.threadId = api->threadId;
          break;
        }
        default:
          continue;
      }
      out.push_back(std::move(a));
    }
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(context, streamId, &lost) == CUPTI_SUCCESS && lost > 0) {
      dropped_.fetch_add(lost);
    }
    if (!out.empty() && callback_) callback_(out);
  }
#undef TPS_CUPTI

  Callback callback_;
  bool enabled_ = false;
  bool quiet_ = false;
  std::string reason_;
  std::vector<CUpti_ActivityKind> enabledKinds_;
  int64_t clockShift_ = 0;
  std::atomic<int> outstanding_{0};
  std::atomic<uint64_t> dropped_{0};
  std::unordered_map<uint64_t, bool> launchApi_;  // CUPTI's buffer thread only
};

}  // namespace

std::unique_ptr<GpuActivitySource> makeCuptiSource() { return std::make_unique<CuptiSource>(); }

}  // namespace tpscope::probes
