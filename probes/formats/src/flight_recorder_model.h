// The ranks' Flight Recorder dumps (flight_recorder_dump.h) as tpscope rows: process groups, ranks, threads and one
// collectives row per (rank, group, seq), following docs/formats.md "Flight Recorder dumps":
//   group      "<pg_name>:<desc>" as the analyzer prints it ("0:default_pg", "1:tp"; the name alone when the desc is
//              empty or "undefined"); members from pg_config (the largest list any dump gives); the world group
//              (desc "default_pg") 0 .. the highest rank dumped or named in any pg_config (PyTorch 2.15's Gloo
//              recorder keys one group "", whichever was registered last, and names no other); else the ranks that
//              recorded the group (counted in `skipped`)
//   missing    the ranks 0 .. that highest rank without a dump
//   seq        collective_seq_id; entries of one rank that share it (a coalesced group: its ops and the
//              "coalesced" entry that ends it) are one row: op the members' op ("coalesced" when they differ),
//              numel the sum, shape each tensor's numel when there are several
//   P2P        send/recv entries go to the pseudo-group "p2p-<src>-<dst>" (global ranks, from the group ranks in the
//              profiling name "send 0->1" / "recv 1<-0" and the group's sorted members), seq = the message's number
//              on that directed pair on that rank, in record order; recv_any_source ("?") is counted, not kept
//   state      completed (state "completed" or a completion time), started, else scheduled — except a retired
//              entry without times: completed for Gloo (its recorder marks no times and retires the work when it
//              finishes), timed_out for the others (c10d retires an unfinished entry on timeout)
//   times      enqueue_ns = time_created_ns, start_ns / end_ns = time_discovered_started / completed (unset: NULL),
//              absolute Unix ns here (the import subtracts the run's epoch)
//   callsite   "<profiling_name> at <func> (<file>:<line>)": the innermost frame outside torch/ (the pickle's frames;
//              the JSON has none: the profiling name alone)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flight_recorder_dump.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::formats::fr {

struct RankDump {
  int rank = 0;
  std::string file;  // its name, for messages and meta
  std::string form;  // "pickle" or "json"
  Dump dump;
};

struct RunModel {
  std::vector<tracedb::GroupInfo> groups;
  std::vector<tracedb::RankInfo> ranks;
  std::vector<tracedb::ThreadInfo> threads;
  std::vector<tracedb::CollectiveRow> collectives;  // absolute times
  std::vector<int> missingRanks;  // named by a process group, no dump
  int64_t minNs = 0;              // the earliest time_created_ns (0 without entries)
  std::map<std::string, int64_t> skipped;
};

// `dumps` by rank, each rank once.
RunModel buildRunModel(const std::vector<RankDump>& dumps);

// The group name tpscope gives a process group: "<name>:<desc>", or the name alone.
std::string groupName(const std::string& pgName, const std::string& pgDesc);

}  // namespace tpscope::formats::fr
