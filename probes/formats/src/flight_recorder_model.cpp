#include "flight_recorder_model.h"

#include <algorithm>
#include <set>

#include "kineto_names.h"

namespace tpscope::formats::fr {

using tracedb::CollectiveRow;
using tracedb::CollectiveState;

std::string groupName(const std::string& pgName, const std::string& pgDesc) {
  if (pgDesc.empty() || pgDesc == "undefined") return pgName;
  return pgName + ":" + pgDesc;
}

namespace {

bool isP2pType(std::string_view type) { return type == "send" || type == "recv"; }

// Progress order of a state, to merge the entries of a coalesced group (the furthest wins).
int progress(CollectiveState s) {
  switch (s) {
    case CollectiveState::Scheduled: return 0;
    case CollectiveState::Started: return 1;
    case CollectiveState::TimedOut: return 2;
    case CollectiveState::Failed: return 3;
    case CollectiveState::Completed: return 4;
  }
  return 0;
}

CollectiveState stateOf(const Entry& e) {
  if (e.state == "completed" || e.completedNs) return CollectiveState::Completed;
  if (e.state == "started" || e.startedNs) return CollectiveState::Started;
  if (e.retired) return e.backend == "gloo" ? CollectiveState::Completed : CollectiveState::TimedOut;
  return CollectiveState::Scheduled;
}

// The innermost frame of the caller's code: outside torch/ and the Python library (contextlib's __exit__ of a
// coalescing manager), else outside torch/ only.
std::string callsiteOf(const Entry& e) {
  auto isTorch = [](const Frame& f) { return f.filename.empty() || f.filename.find("/torch/") != std::string::npos; };
  auto isLibrary = [](const Frame& f) {
    const size_t lib = f.filename.find("/lib/python");
    return lib != std::string::npos && f.filename.find("site-packages", lib) == std::string::npos;
  };
  for (bool skipLibrary : {true, false})
    for (const Frame& f : e.frames) {
      if (isTorch(f) || (skipLibrary && isLibrary(f))) continue;
      const size_t slash = f.filename.rfind('/');
      const std::string base = slash == std::string::npos ? f.filename : f.filename.substr(slash + 1);
      return e.profilingName + " at " + f.name + " (" + base + ":" + std::to_string(f.line) + ")";
    }
  return e.profilingName;
}

int64_t numelOf(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// One row's tensors: what the entries of a (coalesced) call hold.
struct Tensors {
  std::vector<std::vector<int64_t>> sizes;
  std::vector<std::string> dtypes;
};

void fillSizes(CollectiveRow& row, const Tensors& t) {
  row.numel = 0;
  for (const auto& s : t.sizes) row.numel += numelOf(s);
  if (t.sizes.size() == 1) {
    row.shape = t.sizes.front();
  } else {
    row.shape.clear();
    for (const auto& s : t.sizes) row.shape.push_back(numelOf(s));
  }
  std::vector<std::string> distinct;
  for (const std::string& d : t.dtypes) {
    std::string n = kineto::normalizeDtype(d);
    if (n.empty()) n = d;
    if (std::find(distinct.begin(), distinct.end(), n) == distinct.end()) distinct.push_back(n);
  }
  row.dtype.clear();
  for (const std::string& d : distinct) row.dtype += (row.dtype.empty() ? "" : ",") + d;
  const int size = distinct.size() == 1 ? kineto::dtypeSize(distinct.front()) : 0;
  row.bytes = row.numel * size;
}

std::string opOf(const std::string& type) {
  std::string op = kineto::normalizeCollectiveOp(type);
  return op.empty() ? type : op;
}

struct GroupFacts {
  std::string desc, backend;
  std::vector<int> configRanks;  // the longest pg_config list
  std::set<int> recordedBy;
};

class Builder {
 public:
  explicit Builder(const std::vector<RankDump>& dumps) : dumps_(dumps) {}

  RunModel build() {
    collectGroups();
    for (const RankDump& d : dumps_) addRank(d);
    finishGroups();
    return std::move(out_);
  }

 private:
  void collectGroups() {
    for (const RankDump& d : dumps_) {
      dumped_.insert(d.rank);
      expected_.insert(d.rank);
      for (const PgConfig& pc : d.dump.pgConfig) {
        expected_.insert(pc.ranks.begin(), pc.ranks.end());
        if (pc.name.empty()) continue;  // 2.15 Gloo: the last group registered before it had a name (world or not)
        GroupFacts& g = facts_[pc.name];
        if (g.desc.empty()) g.desc = pc.desc;
        if (pc.ranks.size() > g.configRanks.size()) g.configRanks = pc.ranks;
      }
      for (const Entry& e : d.dump.entries) {
        GroupFacts& g = facts_[e.pgName];
        if (g.desc.empty()) g.desc = e.pgDesc;
        if (g.backend.empty()) g.backend = e.backend;
        g.recordedBy.insert(d.rank);
      }
    }
    // Global ranks are 0 .. world - 1: a rank below the highest one named anywhere is part of the job.
    const int highest = expected_.empty() ? -1 : *expected_.rbegin();
    for (int r = 0; r <= highest; ++r) expected_.insert(r);
    for (int r : expected_)
      if (!dumped_.count(r)) out_.missingRanks.push_back(r);
    for (auto& [name, g] : facts_) {
      std::vector<int> members = g.configRanks;
      if (members.empty() && (g.desc == "default_pg" || (g.desc.empty() && name == "0"))) {
        members.assign(expected_.begin(), expected_.end());
      }
      if (members.empty()) {
        members.assign(g.recordedBy.begin(), g.recordedBy.end());
        ++out_.skipped["process group without pg_config ranks (members: the ranks that recorded it)"];
      }
      members_[name] = members;
      out_.groups.push_back(tracedb::GroupInfo{groupName(name, g.desc), members, g.backend});
    }
  }

  void finishGroups() {
    for (auto& [name, ranks] : p2pGroups_) {
      auto [src, dst] = name;
      out_.groups.push_back(tracedb::GroupInfo{"p2p-" + std::to_string(src) + "-" + std::to_string(dst),
                                               {src, dst}, ranks});
    }
    if (out_.minNs == INT64_MAX) out_.minNs = 0;
  }

  int threadOf(int rank, const Entry& e) {
    auto [it, fresh] = threadIds_.emplace(std::pair{rank, e.threadId}, static_cast<int>(threadIds_.size()));
    if (fresh) {
      int dense = 0;
      for (const auto& [key, id] : threadIds_) dense += key.first == rank ? 1 : 0;
      it->second = dense - 1;
      out_.threads.push_back(tracedb::ThreadInfo{rank, it->second, std::string(tracedb::thread_kinds::kCpu),
                                                 e.threadName.empty() ? "thread " + e.threadId : e.threadName});
    }
    return it->second;
  }

  CollectiveRow baseRow(int rank, const Entry& e) {
    CollectiveRow row;
    row.rank = rank;
    row.thread = threadOf(rank, e);
    row.enqueueNs = e.timeCreatedNs;
    row.startNs = e.startedNs;
    row.endNs = e.completedNs;
    row.state = stateOf(e);
    row.callsite = callsiteOf(e);
    out_.minNs = std::min(out_.minNs, e.timeCreatedNs);
    return row;
  }

  // A send or recv: its row in the directed pair's pseudo-group. False (counted) when the peer cannot be named.
  void addP2p(int rank, const Entry& e, std::map<std::pair<int, int>, int64_t>& pairSeq) {
    const std::vector<int>& members = members_[e.pgName];
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    if (e.src == Entry::kAnyPeer) {
      ++out_.skipped["recv from any source (no peer to pair it with)"];
      return;
    }
    if (e.src < 0 || e.dst < 0 || e.src >= static_cast<int>(sorted.size()) ||
        e.dst >= static_cast<int>(sorted.size())) {
      ++out_.skipped["send/recv whose peers are not ranks of its group"];
      return;
    }
    const int src = sorted[e.src], dst = sorted[e.dst];
    CollectiveRow row = baseRow(rank, e);
    row.group = "p2p-" + std::to_string(src) + "-" + std::to_string(dst);
    row.seq = ++pairSeq[{src, dst}];
    row.op = e.type;
    const auto& sizes = e.type == "recv" && !e.outputSizes.empty() ? e.outputSizes : e.inputSizes;
    const auto& dtypes = e.type == "recv" && !e.outputDtypes.empty() ? e.outputDtypes : e.inputDtypes;
    fillSizes(row, Tensors{sizes, dtypes});
    if (!p2pGroups_.count({src, dst})) p2pGroups_[{src, dst}] = e.backend;
    p2pRows_[{rank, e.pgName, e.p2pSeq}].push_back(out_.collectives.size());
    out_.collectives.push_back(std::move(row));
  }

  void addRank(const RankDump& d) {
    std::map<std::pair<int, int>, int64_t> pairSeq;
    // (pg, collective_seq_id) -> the row and its tensors, for the entries of a coalesced call
    std::map<std::pair<std::string, int64_t>, std::pair<size_t, Tensors>> open;
    std::map<size_t, std::set<std::string>> opsOfRow;
    const Entry* previous = nullptr;
    tracedb::RankInfo info;
    info.rank = d.rank;
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const Entry& e : d.dump.entries) {
      first = std::min(first, e.timeCreatedNs);
      last = std::max({last, e.timeCreatedNs, e.completedNs.value_or(INT64_MIN), e.startedNs.value_or(INT64_MIN)});
      if (e.backend == "nccl") info.device = "cuda";
      const bool p2p = e.isP2p || isP2pType(e.type);
      if (e.type == "coalesced" && (p2p || (previous && previous->isP2p && previous->pgName == e.pgName))) {
        // The end of a batch of sends and receives: its state is theirs.
        for (size_t i : p2pRows_[{d.rank, e.pgName, e.p2pSeq}]) {
          CollectiveRow& row = out_.collectives[i];
          if (progress(stateOf(e)) > progress(row.state)) row.state = stateOf(e);
          if (!row.startNs) row.startNs = e.startedNs;
          if (!row.endNs) row.endNs = e.completedNs;
        }
        previous = &e;
        continue;
      }
      if (p2p) {
        addP2p(d.rank, e, pairSeq);
        previous = &e;
        continue;
      }
      auto key = std::pair{e.pgName, e.collectiveSeq};
      auto it = open.find(key);
      if (it == open.end()) {
        CollectiveRow row = baseRow(d.rank, e);
        row.group = groupName(e.pgName, facts_[e.pgName].desc);
        row.seq = e.collectiveSeq;
        it = open.emplace(key, std::pair{out_.collectives.size(), Tensors{}}).first;
        out_.collectives.push_back(std::move(row));
      } else {
        ++out_.skipped["entries merged into their coalesced call's row"];
        CollectiveRow& row = out_.collectives[it->second.first];
        const CollectiveState s = stateOf(e);
        if (e.type == "coalesced" || progress(s) > progress(row.state)) row.state = s;
        if (e.startedNs && (!row.startNs || e.type == "coalesced")) row.startNs = e.startedNs;
        if (e.completedNs && (!row.endNs || e.type == "coalesced")) row.endNs = e.completedNs;
      }
      const size_t rowIndex = it->second.first;
      if (e.type != "coalesced") {
        Tensors& t = it->second.second;
        t.sizes.insert(t.sizes.end(), e.inputSizes.begin(), e.inputSizes.end());
        t.dtypes.insert(t.dtypes.end(), e.inputDtypes.begin(), e.inputDtypes.end());
        opsOfRow[rowIndex].insert(opOf(e.type));
        fillSizes(out_.collectives[rowIndex], t);
      }
      const auto& ops = opsOfRow[rowIndex];
      out_.collectives[rowIndex].op = ops.size() == 1 ? *ops.begin() : "coalesced";
      previous = &e;
    }
    info.worldSize = expected_.empty() ? 1 : *expected_.rbegin() + 1;
    if (first != INT64_MAX) {
      info.startNs = first;
      info.endNs = last;
    }
    out_.ranks.push_back(info);
  }

  const std::vector<RankDump>& dumps_;
  RunModel out_ = [] {
    RunModel m;
    m.minNs = INT64_MAX;
    return m;
  }();
  std::set<int> dumped_, expected_;
  std::map<std::string, GroupFacts> facts_;
  std::map<std::string, std::vector<int>> members_;
  std::map<std::pair<int, int>, std::string> p2pGroups_;  // (src, dst) -> backend
  std::map<std::tuple<int, std::string, int64_t>, std::vector<size_t>> p2pRows_;  // (rank, pg, p2p_seq_id) -> rows
  std::map<std::pair<int, std::string>, int> threadIds_;
};

}  // namespace

RunModel buildRunModel(const std::vector<RankDump>& dumps) { return Builder(dumps).build(); }

}  // namespace tpscope::formats::fr
