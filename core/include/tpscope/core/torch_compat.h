// The one place where LibTorch 1.13 (Debian, CPU, Gloo) and LibTorch 2.x differ for core/.
//
// 1.13: ProcessGroupGloo derives from c10d::ProcessGroup and its collectives return c10d::Work.
// 2.x:  ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend; ProcessGroup wraps backends.
// Calling the collectives on the concrete backend type keeps one source for both: core stores a
// `compat::Backend` pointer (the common base of Gloo and NCCL) and calls allreduce/allgather/broadcast/barrier on it.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>

#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TPSCOPE_HAVE_NCCL 1
#else
#define TPSCOPE_HAVE_NCCL 0
#endif

namespace tpscope::core::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = ::c10d::Backend;
#else
using Backend = ::c10d::ProcessGroup;
#endif
using Work = ::c10d::Work;

// Debian's 1.13 Gloo has no reduce_scatter / _allgather_base and no bf16; the communicator emulates them.
// A LibTorch 2.x Gloo still lacks bf16 reduce-scatter on CPU, so the emulation stays for Gloo on both.
inline constexpr bool kGlooHasReduceScatter = false;

// `loopback`: bind Gloo to 127.0.0.1 (single machine); else to the interface of this host's name (multi-node).
inline c10::intrusive_ptr<Backend> makeGloo(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, bool loopback) {
  auto opts = ::c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(loopback ? ::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : ::c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size, opts);
}

#if TPSCOPE_HAVE_NCCL
inline c10::intrusive_ptr<Backend> makeNccl(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  auto opts = ::c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
#endif

}  // namespace tpscope::core::compat
