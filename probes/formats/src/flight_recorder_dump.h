// One rank's Flight Recorder dump, read by key from the plain values of either form (flight_recorder_value.h), for
// every format version PyTorch has written from 2.3 to 2.10 and, by the same keys, later ones:
//   version            "2.3" ... "2.10" (a string; major.minor)
//   pg_config          {pg_name: {name, desc, ranks}}: ranks a string "[0, 1]" (as the writers emit it) or a list;
//                      PyTorch 2.15's Gloo recorder keys one group "" (the last one registered before it had a name)
//   pg_status          {pg_id: {last_enqueued_collective, last_started_collective, last_completed_collective}}:
//                      ints in the pickle, strings in the JSON (-1: none)
//   entries            omitted by the JSON writer when empty; ordered here by record_id (the ring buffer may have
//                      wrapped: the dump lists them oldest first, and the record ids say so)
//   per entry          record_id, pg_id, process_group [name, desc], collective_seq_id, p2p_seq_id, op_id,
//                      profiling_name ("nccl:all_reduce", "gloo:broadcast", "nccl:send 0->1", "nccl:recv 1<-0",
//                      "gloo:recv 3<-?", "nccl:coalesced"), time_created_ns, time_discovered_started_ns and
//                      time_discovered_completed_ns (None in the pickle, 0 in the JSON, or absent: unset),
//                      duration_ms (absent when unknown), input_sizes / output_sizes (a list per tensor),
//                      input_dtypes / output_dtypes ("Float", "BFloat16", ...; from 2.4), state ("scheduled",
//                      "started", "completed"), retired, timeout_ms, is_p2p (older dumps: from the op name),
//                      thread_id / thread_name, frames [{name, filename, line}] (the pickle only, innermost first)
// A key that is missing where it is optional is left at its default; a required one (version, profiling_name,
// process_group, time_created_ns, a sequence id) missing or of the wrong type fails the dump with the key named.
// Pre-2.3 dumps' seq_id is read as collective_seq_id.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flight_recorder_value.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::formats::fr {

struct Frame {
  std::string name, filename;
  int64_t line = 0;
};

struct Entry {
  int64_t recordId = 0;
  int64_t pgId = -1;
  std::string pgName, pgDesc;
  int64_t collectiveSeq = 0, p2pSeq = 0, opId = 0;
  bool isP2p = false;
  std::string profilingName;
  std::string backend;  // "nccl", "gloo", ... (before the last ':' of profiling_name)
  std::string type;     // the op as written: "all_reduce", "_all_gather_base", "send", "coalesced", ...
  // P2P peers as group ranks: send "s->d", recv "d<-s"; -1 when not P2P, kAnyPeer for recv_any_source ("?").
  int src = -1, dst = -1;
  static constexpr int kAnyPeer = -2;
  int64_t timeCreatedNs = 0;
  std::optional<int64_t> startedNs, completedNs;  // unset: None, 0 or absent
  std::optional<double> durationMs;
  std::vector<std::vector<int64_t>> inputSizes, outputSizes;
  std::vector<std::string> inputDtypes, outputDtypes;
  std::string state;  // as written
  bool retired = false;
  int64_t timeoutMs = 0;
  std::string threadName, threadId;
  std::vector<Frame> frames;
};

struct PgConfig {
  std::string name, desc;
  std::vector<int> ranks;
};

struct PgStatus {
  int64_t lastEnqueued = -1, lastStarted = -1, lastCompleted = -1;
};

struct Dump {
  std::string version;
  int major = 0, minor = 0;
  std::string commLibVersion;
  std::vector<PgConfig> pgConfig;
  std::map<std::string, PgStatus> pgStatus;  // by pg_id
  std::vector<Entry> entries;                // by record_id
  std::map<std::string, int64_t> skipped;    // entry problems that are not fatal: reason -> count
};

// Reads a parsed dump. `what` names the file in errors.
tracedb::Result<Dump> readDump(const ValueTree& tree, const std::string& what);

// "[0, 1, 2]" -> {0, 1, 2}; nullopt unless it is a list of integers (spaces allowed).
std::optional<std::vector<int>> parseRanksText(std::string_view text);

}  // namespace tpscope::formats::fr
