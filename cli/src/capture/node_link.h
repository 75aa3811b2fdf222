// The control channel between the node captures of one multi-node job (`tpscope capture --nnodes N`,
// docs/capture.md "Many nodes").
//
// Node 0's capture serves a TcpKvServer at --master-addr, port --master-port + 1, with the job's token: it is the
// control channel of the node captures and the clock-alignment store of every rank (TPSCOPE_CLOCK_STORE). Every node
// (node 0 too) talks to it as a client. A wrong token is refused; nothing but the job's own nodes and ranks get in,
// and strangers that connect without logging in are dropped within seconds without taking a rank's place
// (storeLimits(), tcp_store.h).
//
// Keys (all under "tpscope/job/"):
//   hello/<K>    node K, once connected: its host name
//   info         node 0, once every node has said hello: "<run id>\n<epoch ns>\n<nproc per node>\n<world size>" —
//                every node's ranks use this run id and time origin, and a node whose layout differs refuses to
//                start. No node starts a rank before it is set; a node that never says hello within the rendezvous
//                timeout makes node 0 give up (naming it), which ends the others' wait too (the channel closes).
//   stop         the node that stops the job first: "<exit status> <node> <why>", set if absent (the first claim
//                holds); every node polls it and stops its own ranks with the same exit status
//   done/<K>     node K, once its ranks have ended: its exit status (node 0 keeps the store up until all are in)
//
// Threading: the launcher's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tpscope/probes/tcp_store.h"

namespace tpscope::cli::capture {

struct JobInfo {
  std::string runId;
  int64_t epochNs = 0;
  int nprocPerNode = 0;
  int worldSize = 0;
};

struct RemoteStop {
  int exitStatus = 0;
  int node = -1;
  std::string why;
};

class NodeLink {
 public:
  struct Options {
    int nnodes = 1;
    int nodeRank = 0;
    std::string masterAddr;
    int controlPort = 0;
    std::string token;
    std::chrono::milliseconds rendezvousTimeout{900'000};
    probes::TcpKvLimits storeLimits;  // node 0's store (storeLimits())
  };

  // Node 0: listens (loopback when --master-addr is a loopback address, else every interface) and connects to
  // itself. Other nodes: connect, retrying until the rendezvous timeout (node 0 may start later). nullptr and `error`
  // set on failure; `refused` tells a wrong token apart.
  static std::unique_ptr<NodeLink> open(const Options& options, std::string* error, bool* refused);
  ~NodeLink();

  // "host:port" of the store, for the ranks' TPSCOPE_CLOCK_STORE.
  std::string storeAddress() const;

  // Node 0: waits until every node has said hello, then publishes the job; false (and the nodes that never came in
  // `error`) after the rendezvous timeout.
  bool waitForNodesAndPublish(const JobInfo& job, std::string* error);
  // Other nodes: says hello with `host`, then reads the job node 0 publishes once all are in (waits up to the
  // rendezvous timeout, less when node 0 gives up first).
  std::optional<JobInfo> helloAndReadJob(const std::string& host, std::string* error);

  // Tells every node to stop (an abnormal event on this node, or Ctrl-C here) unless another node did first; returns
  // the stop that holds — ours, or the first claim (nullopt when the channel failed).
  std::optional<RemoteStop> claimStop(int exitStatus, const std::string& why);
  // Another node's stop, if one was posted. `lost` is set when the channel to node 0 is gone (node 0's capture
  // ended or its machine died), which stops the job as well.
  std::optional<RemoteStop> pollStop(bool* lost);
  // This node's ranks have all ended with `exitStatus`.
  void postDone(int exitStatus);
  // Node 0: waits (at most `timeout`) until every other node has posted done; returns the statuses seen by node.
  std::map<int, int> waitForDone(std::chrono::milliseconds timeout);

  int nodeRank() const { return o_.nodeRank; }
  int nnodes() const { return o_.nnodes; }
  // Node 0: what its store dropped and holds (tcp_store.h); nullopt on the other nodes.
  std::optional<probes::TcpKvServerStats> storeStats() const;

 private:
  explicit NodeLink(Options o) : o_(std::move(o)) {}
  // get(name) until `deadline`, past the store's 10-minute cap on one wait; nullopt at the deadline or when the
  // channel is lost.
  std::optional<std::string> waitFor(const std::string& name, std::chrono::steady_clock::time_point deadline);

  Options o_;
  std::unique_ptr<probes::TcpKvServer> server_;  // node 0 only
  std::unique_ptr<probes::TcpKvClient> client_;
  bool lost_ = false;
};

// A fresh random token (32 hex digits from std::random_device).
std::string makeToken();

// The limits of the store a capture serves for a job of `ranks` ranks on `nnodes` nodes: every rank and every node
// capture holds one authenticated connection for the whole run (+16 to spare: a tool, a reconnect); strangers are
// capped and timed apart (tcp_store.h's defaults).
probes::TcpKvLimits storeLimits(int ranks, int nnodes);

}  // namespace tpscope::cli::capture
