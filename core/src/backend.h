// Internal: the definition of Communicator::Backend (a c10d backend handle). Only mesh.cpp and communicator.cpp.
#pragma once

#include "tpscope/core/communicator.h"
#include "tpscope/core/torch_compat.h"

namespace tpscope::core {

struct Communicator::Backend {
  c10::intrusive_ptr<compat::Backend> pg;
  bool gloo = true;  // false: NCCL (native bf16 and reduce-scatter)
  c10::Device device{c10::kCPU};  // NCCL: the rank's GPU, where host tensors are staged
};

}  // namespace tpscope::core
