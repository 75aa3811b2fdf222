#include "tpscope/probes/nvtx.h"

#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "tpscope/probes/probes.h"

namespace tpscope::probes {

namespace {

constexpr size_t kSlots = 4096;  // power of two
constexpr int kMaxProbe = 64;

struct Slot {
  std::atomic<const Site*> site{nullptr};
  std::atomic<nvtxStringHandle_t> handle{nullptr};
};
Slot g_slots[kSlots];
std::atomic<nvtxDomainHandle_t> g_domain{nullptr};
std::atomic<uint64_t> g_registered{0}, g_ascii{0};

// ARGB per SpanKind (compute, comm, data, optimizer, step, checkpoint, kernel, memcpy, memset, nccl, other, wait).
constexpr uint32_t kColors[] = {0xFF4C9BE8, 0xFFE8744C, 0xFF8BC34A, 0xFFAB47BC, 0xFF607D8B, 0xFF795548,
                                0xFF26A69A, 0xFFFFCA28, 0xFFFFA726, 0xFFEF5350, 0xFF9E9E9E, 0xFFBDBDBD};

nvtxDomainHandle_t domain() {
  nvtxDomainHandle_t d = g_domain.load(std::memory_order_acquire);
  if (d == nullptr) {
    nvtxDomainHandle_t created = nvtxDomainCreateA("tpscope");
    if (g_domain.compare_exchange_strong(d, created, std::memory_order_acq_rel)) {
      d = created;
    }  // else another thread won; its handle is in d (the extra domain is harmless)
  }
  return d;
}

// The registered string of `site`, registering it on first sight; null when the table is full.
nvtxStringHandle_t siteString(nvtxDomainHandle_t d, const Site* site) {
  size_t i = (reinterpret_cast<uintptr_t>(site) >> 4) * 0x9E3779B97F4A7C15ull >> 52;
  for (int probe = 0; probe < kMaxProbe; ++probe, i = (i + 1) & (kSlots - 1)) {
    Slot& s = g_slots[i & (kSlots - 1)];
    const Site* cur = s.site.load(std::memory_order_acquire);
    if (cur == site) {
      if (nvtxStringHandle_t h = s.handle.load(std::memory_order_acquire)) return h;
      return nvtxDomainRegisterStringA(d, site->name);  // being registered by another thread right now
    }
    if (cur == nullptr) {
      if (s.site.compare_exchange_strong(cur, site, std::memory_order_acq_rel)) {
        nvtxStringHandle_t h = nvtxDomainRegisterStringA(d, site->name);
        s.handle.store(h, std::memory_order_release);
        g_registered.fetch_add(1, std::memory_order_relaxed);
        return h;
      }
      if (cur == site) {
        if (nvtxStringHandle_t h = s.handle.load(std::memory_order_acquire)) return h;
        return nvtxDomainRegisterStringA(d, site->name);
      }
    }
  }
  return nullptr;
}

void push(const Site* site, int16_t /*layer*/) {
  nvtxDomainHandle_t d = domain();
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = kColors[static_cast<size_t>(site->kind) % (sizeof kColors / sizeof kColors[0])];
  if (nvtxStringHandle_t h = siteString(d, site)) {
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = h;
  } else {
    g_ascii.fetch_add(1, std::memory_order_relaxed);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = site->name;
  }
  nvtxDomainRangePushEx(d, &a);
}

void pop() { nvtxDomainRangePop(domain()); }

// Whether an NVTX tool can attach to this process: NVTX looks for one only at its first call, in the two places
// checked here (the injection library named by NVTX_INJECTION64_PATH, which Nsight Systems and Nsight Compute set, and
// a statically linked injection's InitializeInjectionNvtx2_fnptr, which nvtxInit.h declares weak: null unless one is
// linked in). Without one, every NVTX call is a no-op stub behind a function pointer, so mirroring would cost a
// span ~14 ns (two calls, the site lookup) for nothing.
bool nvtxToolPresent() {
  const char* path = std::getenv(sizeof(void*) == 8 ? "NVTX_INJECTION64_PATH" : "NVTX_INJECTION32_PATH");
  if (path != nullptr && *path != '\0') return true;
#if NVTX_SUPPORT_STATIC_INJECTION_LIBRARY
  if (InitializeInjectionNvtx2_fnptr != nullptr) return true;
#endif
  return false;
}

}  // namespace

bool installNvtxMirror() {
  if (!nvtxToolPresent()) return false;  // the spans' only cost stays the null hook check
  domain();
  detail::g_rangePush.store(&push, std::memory_order_release);
  detail::g_rangePop.store(&pop, std::memory_order_release);
  return true;
}

void uninstallNvtxMirror() {
  detail::g_rangePush.store(nullptr, std::memory_order_release);
  detail::g_rangePop.store(nullptr, std::memory_order_release);
}

bool nvtxMirrorInstalled() { return detail::g_rangePush.load(std::memory_order_acquire) == &push; }

NvtxMirrorStats nvtxMirrorStats() {
  return NvtxMirrorStats{g_registered.load(std::memory_order_relaxed), g_ascii.load(std::memory_order_relaxed)};
}

}  // namespace tpscope::probes
