// NVTX mirror of the probe spans: while installed, every span that records is also an NVTX range (push at the span's
// start, pop at its end) in the domain "tpscope", named after its site (a string registered once per site), coloured
// by its kind. Nsight Systems, or any NVTX tool, then shows the same spans as the trace. Without a tool that can
// attach, nothing is installed (an NVTX call would be a no-op stub, but the mirror's lookups and calls cost ~14 ns).
//
// The hooks are probes::detail::g_rangePush/g_rangePop; the site → registered-string cache is a fixed lock-free
// table (4096 sites; past that, ranges carry the name as plain ASCII). Any thread; never throws.
#pragma once

#include <cstdint>

namespace tpscope::probes {

// Installs the hooks (idempotent) when an NVTX tool can attach (NVTX_INJECTION64_PATH set, as Nsight Systems does,
// or a static injection linked in); returns false, installing nothing, when none can: the spans then cost what they
// cost without the mirror. NVTX looks for a tool only once, at its first call, so none can attach later.
bool installNvtxMirror();
// Removes the hooks. A span that started mirrored and ends after this leaves its range unpopped.
void uninstallNvtxMirror();
bool nvtxMirrorInstalled();

struct NvtxMirrorStats {
  uint64_t sitesRegistered = 0;  // sites with a registered string
  uint64_t sitesAscii = 0;       // pushes that fell back to an ASCII name (table full)
};
NvtxMirrorStats nvtxMirrorStats();

}  // namespace tpscope::probes
