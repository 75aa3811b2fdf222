// Communicator: the ONE place core issues collectives — and therefore the one place they are recorded.
//
// Every collective of a process group goes through a Communicator. Before issuing one it
//   * bumps the group's sequence number (1-based, identical on every member, counted whether or not a probe sink
//     is recording — (group, seq) is the key that joins the ranks' views of one collective),
//   * if `probes::sink()` is non-null, reports it enqueued with the LOGICAL op, dtype, shape and bytes the caller
//     asked for (a reduce-scatter emulated with an all-reduce is recorded as "reduce_scatter"; a bf16 tensor sent
//     as fp32 is recorded as "bfloat16"), then Started, then Completed / TimedOut / Failed.
// On Gloo (CPU), reduce-scatter is an all-reduce followed by taking this rank's chunk (one code path whatever the
// PyTorch version's Gloo offers), and bf16/fp16 tensors are converted to fp32 and back; NCCL runs both natively.
//
// Timeouts: the group's timeout is fixed when the group is created (Gloo ignores per-op timeouts). A timed-out or
// failed collective throws CollectiveError naming group, seq and op; afterwards the communicator refuses further
// collectives (the peers are out of step and the group is unusable): end the rank.
//
// Threading: a Communicator is used by one thread at a time (the training thread; autograd's backward runs on the
// calling thread on CPU). Size-1 communicators never issue anything and do not count sequence numbers.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tpscope/core/callsite.h"

namespace tpscope::core {

// Thrown when a collective times out or fails. `timedOut()` separates the two. After it the group is dead.
class CollectiveError : public std::runtime_error {
 public:
  CollectiveError(const std::string& what, bool timedOut) : std::runtime_error(what), timedOut_(timedOut) {}
  bool timedOut() const noexcept { return timedOut_; }

 private:
  bool timedOut_;
};

enum class ReduceOp { Sum, Max };

// An asynchronous all-reduce in flight. `wait()` must be called exactly once, on the thread that issued it.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();
  // Blocks until done; copies the result back into the caller's tensor (dtype conversion) and records Completed.
  void wait();
  bool valid() const noexcept { return state_ != nullptr; }

  struct State;
  explicit PendingCollective(std::unique_ptr<State> s);

 private:
  std::unique_ptr<State> state_;
};

class Communicator {
 public:
  struct Backend;  // opaque c10d backend (Gloo on CPU, NCCL on CUDA); see torch_compat.h

  // `globalRanks`: members in group-rank order; `rank`: this process's rank in the group. `backend` may be null
  // only when the group has one member.
  Communicator(std::string name, std::vector<int> globalRanks, int rank, std::shared_ptr<Backend> backend,
               std::chrono::milliseconds timeout);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // A one-member communicator with no backend (TP=1 / DP=1, and single-process tests).
  static std::unique_ptr<Communicator> solo(std::string name, int globalRank);

  const std::string& name() const noexcept { return name_; }
  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  int rank() const noexcept { return rank_; }
  const std::vector<int>& globalRanks() const noexcept { return ranks_; }
  uint64_t seq() const noexcept { return seq_; }  // sequence number of the last collective issued
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // In place. `phase` says whether the collective belongs to forward, backward, optimizer...
  void allReduce(at::Tensor& t, ReduceOp op, const Callsite& site, probes::Phase phase);
  PendingCollective allReduceAsync(at::Tensor t, const Callsite& site, probes::Phase phase);
  // Concatenation of every member's `t` along `dim` (all members pass the same shape).
  at::Tensor allGather(const at::Tensor& t, int64_t dim, const Callsite& site, probes::Phase phase);
  // Sum over members, then this member's chunk along `dim` (size along dim divisible by the group size).
  // Emulated by an all-reduce (Debian's Gloo has no reduce-scatter): recorded as the logical op, and the run says so
  // in meta 'emulated_ops' (emulatedOps(): "reduce_scatter=all_reduce") so that bandwidth figures count what really
  // moved.
  static std::string emulatedOps();
  at::Tensor reduceScatter(const at::Tensor& t, int64_t dim, const Callsite& site, probes::Phase phase);
  // In place; `root` is a group rank.
  void broadcast(at::Tensor& t, int root, const Callsite& site, probes::Phase phase);
  void barrier(const Callsite& site, probes::Phase phase);

  // Point to point (pipeline parallelism). `peer` is a group rank; `seq` the 1-based sequence number of the
  // directed pair (sender -> receiver), which the caller keeps (pipeline_schedule.h) and which is also the Gloo tag
  // that matches the two sides. Recorded as op "send" / "recv" on the pseudo-group "p2p-<src>-<dst>" (global
  // ranks) with that seq and the tensor's bytes; the blocked time is a comm span "send wait" / "recv".
  // `send` is asynchronous (wait() on the handle; `t` must stay alive until then); `recv` fills `t` and blocks.
  PendingCollective send(const at::Tensor& t, int peer, uint64_t seq, const Callsite& site, probes::Phase phase);
  void recv(at::Tensor& t, int peer, uint64_t seq, const Callsite& site, probes::Phase phase);
  // "p2p-<src>-<dst>" for global ranks src, dst: the group name p2p records carry (docs/schema.md).
  static std::string p2pGroupName(int srcGlobal, int dstGlobal);

 private:
  friend class PendingCollective;
  struct Issue;
  struct P2p {
    int src, dst;  // global ranks
    uint64_t seq;
  };
  Issue begin(vocabulary::CollectiveOp op, const at::Tensor* t, const Callsite& site, probes::Phase phase,
              const P2p* p2p = nullptr);
  [[noreturn]] void fail(const Issue& issue, const std::exception& e);
  // tpscope replay: a collective's result has landed in `result`; the armed op check looks at it (op_check.h).
  void checkResult(const Issue& issue, const at::Tensor& result) const;
  // Shared body of the in-place collectives: records, sends `t` (as fp32 where the backend needs it) through
  // `issue`, which must block until done, and copies the result back.
  void inPlace(vocabulary::CollectiveOp op, at::Tensor& t, const Callsite& site, probes::Phase phase,
               const std::function<void(std::vector<at::Tensor>&)>& issue);

  std::string name_;
  std::vector<int> ranks_;
  int rank_;
  std::shared_ptr<Backend> backend_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  bool dead_ = false;
};

}  // namespace tpscope::core
