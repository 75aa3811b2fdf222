// The NVTX mirror in a process no NVTX tool can attach to (this binary links no static injection and runs without
// NVTX_INJECTION64_PATH): installNvtxMirror() installs nothing, so a span costs what it costs without the mirror,
// and spans record as ever. With NVTX_INJECTION64_PATH set (as Nsight Systems sets it) it installs.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tpscope/probes/nvtx.h"
#include "tpscope/probes/probes.h"

namespace tp = tpscope::probes;

namespace {

TEST(NvtxMirrorWithoutTool, InstallsNothing) {
  ::unsetenv("NVTX_INJECTION64_PATH");
  EXPECT_FALSE(tp::installNvtxMirror());
  EXPECT_FALSE(tp::nvtxMirrorInstalled());
  EXPECT_EQ(tp::detail::g_rangePush.load(), nullptr);
  EXPECT_EQ(tp::detail::g_rangePop.load(), nullptr);
}

TEST(NvtxMirrorWithoutTool, InstallsWhereAToolIsNamed) {
  // A path NVTX will fail to load: its calls then stay no-ops, but the mirror must not second-guess the tool.
  ::setenv("NVTX_INJECTION64_PATH", "/nonexistent/libtpscope-test-injection.so", 1);
  EXPECT_TRUE(tp::installNvtxMirror());
  EXPECT_TRUE(tp::nvtxMirrorInstalled());
  { TPS_SPAN("nvtx.no.tool", Compute, Forward); }  // not recording: neither pushed nor popped, and no crash
  tp::uninstallNvtxMirror();
  EXPECT_FALSE(tp::nvtxMirrorInstalled());
  ::unsetenv("NVTX_INJECTION64_PATH");
}

}  // namespace
