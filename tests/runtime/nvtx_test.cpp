// The NVTX mirror, observed through a static NVTX injection (the mechanism NVTX tools use, linked into this test):
// every recorded span becomes a push/pop pair in domain "tpscope" carrying its site's registered name.
// These tests exercise the recorder through the probe macros whatever TPSCOPE_PROBES says for the build (the
// compiled-out case has its own TU), so the macros are on in this file.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#include <cstdint>

// This TU defines the static injection's entry point, so NVTX's weak default is skipped here; the declaration must
// come before NVTX's loader code.
#define NVTX_STATIC_INJECTION_IMPL 1
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(uint32_t));

#include <gtest/gtest.h>
#include <nvtx3/nvToolsExt.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tpscope/probes/nvtx.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"

namespace {

struct Observed {
  std::mutex mutex;
  std::map<std::string, nvtxDomainHandle_t> domains;
  std::map<nvtxStringHandle_t, std::string> strings;
  std::vector<std::string> pushes;  // names, in push order
  std::vector<uint32_t> colors;
  int pops = 0;
  int depth = 0, maxDepth = 0;
} g_seen;

int g_domainSeq = 0;
uintptr_t g_stringSeq = 0;

nvtxDomainHandle_t NVTX_API fakeDomainCreateA(const char* name) {
  std::lock_guard lock(g_seen.mutex);
  auto& d = g_seen.domains[name];
  if (d == nullptr) d = reinterpret_cast<nvtxDomainHandle_t>(static_cast<uintptr_t>(++g_domainSeq) << 4);
  return d;
}
nvtxStringHandle_t NVTX_API fakeRegisterStringA(nvtxDomainHandle_t, const char* s) {
  std::lock_guard lock(g_seen.mutex);
  auto h = reinterpret_cast<nvtxStringHandle_t>(++g_stringSeq << 4);
  g_seen.strings[h] = s;
  return h;
}
int NVTX_API fakeRangePushEx(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) {
  std::lock_guard lock(g_seen.mutex);
  g_seen.pushes.push_back(a->messageType == NVTX_MESSAGE_TYPE_REGISTERED ? g_seen.strings[a->message.registered]
                                                                         : std::string(a->message.ascii));
  g_seen.colors.push_back(a->color);
  g_seen.maxDepth = std::max(g_seen.maxDepth, ++g_seen.depth);
  return g_seen.depth;
}
int NVTX_API fakeRangePop(nvtxDomainHandle_t) {
  std::lock_guard lock(g_seen.mutex);
  ++g_seen.pops;
  return --g_seen.depth;
}

int NVTX_API initInjection(NvtxGetExportTableFunc_t getExportTable) {
  auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(getExportTable(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) return 0;
  auto set = [&](unsigned id, auto fn) {
    if (id < size && table[id] != nullptr) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
  };
  set(NVTX_CBID_CORE2_DomainCreateA, &fakeDomainCreateA);
  set(NVTX_CBID_CORE2_DomainRegisterStringA, &fakeRegisterStringA);
  set(NVTX_CBID_CORE2_DomainRangePushEx, &fakeRangePushEx);
  set(NVTX_CBID_CORE2_DomainRangePop, &fakeRangePop);
  return 1;
}

}  // namespace

int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(uint32_t)) = &initInjection;

namespace tp = tpscope::probes;

namespace {

TEST(NvtxMirror, EverySpanIsARangeWithItsSiteName) {
  tpscope::testing::TempDir dir;
  tp::RuntimeOptions o;
  o.outDir = dir.path();
  o.installSignalHandlers = false;
  o.flushAtExit = false;
  ASSERT_TRUE(tp::installNvtxMirror());
  EXPECT_TRUE(tp::nvtxMirrorInstalled());
  ASSERT_TRUE(tp::start(o).isOk());
  for (int i = 0; i < 3; ++i) {
    TPS_SPAN("nvtx.outer", Step, None);
    { TPS_SPAN("nvtx.inner", Comm, Forward); }
  }
  std::thread([] { TPS_SPAN("nvtx.thread", Data, Data); }).join();
  tp::stop();
  { TPS_SPAN("nvtx.not.recording", Compute, Forward); }  // not recording: not mirrored either
  tp::uninstallNvtxMirror();
  EXPECT_FALSE(tp::nvtxMirrorInstalled());

  std::lock_guard lock(g_seen.mutex);
  EXPECT_EQ(g_seen.domains.count("tpscope"), 1u);
  const std::vector<std::string> expected = {"nvtx.outer", "nvtx.inner", "nvtx.outer", "nvtx.inner",
                                             "nvtx.outer", "nvtx.inner", "nvtx.thread"};
  EXPECT_EQ(g_seen.pushes, expected);
  EXPECT_EQ(g_seen.pops, 7);
  EXPECT_EQ(g_seen.depth, 0);
  EXPECT_EQ(g_seen.maxDepth, 2);
  EXPECT_NE(g_seen.colors[0], g_seen.colors[1]);  // step and comm differ
  EXPECT_EQ(g_seen.strings.size(), 3u);            // one registration per site, not per span
  EXPECT_EQ(tp::nvtxMirrorStats().sitesRegistered, 3u);
}

}  // namespace
