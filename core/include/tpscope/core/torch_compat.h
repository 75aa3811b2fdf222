// The one place core/ names c10d's concrete backends (PyTorch 2.x's LibTorch, the wheel's).
//
// ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend (ProcessGroup wraps backends): core stores a
// `compat::Backend` pointer, the common base of Gloo and NCCL, and calls allreduce/allgather/broadcast/barrier on it.
// NCCL exists where PyTorch is a CUDA build (its torch_cuda target defines USE_C10D_NCCL).
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

static_assert(TORCH_VERSION_MAJOR >= 2, "tpscope builds against PyTorch 2.x (>= 2.4)");
using Backend = ::c10d::Backend;
using Work = ::c10d::Work;

// Gloo: the communicator emulates reduce-scatter (an all-reduce, then this rank's chunk) and sends bf16 as fp32.
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
