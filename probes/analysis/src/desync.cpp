#include "tpscope/analysis/desync.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "evidence_util.h"
#include "analysis_internal.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

const char* matchStateName(MatchState state) {
  switch (state) {
    case MatchState::FullyMatched: return "fully_matched";
    case MatchState::CollectiveTypeMismatch: return "collective_type_mismatch";
    case MatchState::SizeMismatch: return "size_mismatch";
    case MatchState::StateMismatch: return "state_mismatch";
    case MatchState::DtypeMismatch: return "dtype_mismatch";
    case MatchState::Undecided: return "undecided";
  }
  return "undecided";
}

namespace {

bool completed(const MemberRecord& r) {
  return r.state == "completed" || (r.endNs && r.state != "timed_out" && r.state != "failed");
}

// all-to-all exchanges uneven splits and is often byte-packed: its members' sizes and dtypes legitimately differ
// (PyTorch's flight-recorder analyzer does not compare them either).
bool sizesMayDiffer(std::string_view op) {
  return op == "all_to_all" || op == "alltoall" || op == "all_to_all_single" || op == "alltoall_base";
}

// The two sides of a pipeline point-to-point message (group "p2p-<src>-<dst>") record "send" and "recv".
bool sameOp(std::string_view a, std::string_view b) {
  return a == b || (a == "send" && b == "recv") || (a == "recv" && b == "send");
}

MatchState classify(const std::vector<MemberRecord>& recs) {
  if (recs.size() < 2) return MatchState::Undecided;
  const MemberRecord& a = recs.front();
  for (const auto& r : recs)
    if (!sameOp(r.op, a.op)) return MatchState::CollectiveTypeMismatch;
  if (sizesMayDiffer(a.op)) {
    const bool first = completed(a);
    for (const auto& r : recs)
      if (completed(r) != first || r.state == "timed_out" || r.state == "failed") return MatchState::StateMismatch;
    return MatchState::FullyMatched;
  }
  for (const auto& r : recs)
    if (r.numel != a.numel || (!r.shape.empty() && !a.shape.empty() && r.shape != a.shape))
      return MatchState::SizeMismatch;
  for (const auto& r : recs)
    if (r.dtype != a.dtype) return MatchState::DtypeMismatch;
  const bool first = completed(a);
  for (const auto& r : recs)
    if (completed(r) != first || r.state == "timed_out" || r.state == "failed") return MatchState::StateMismatch;
  return MatchState::FullyMatched;
}

std::vector<int64_t> parseShape(std::string_view s) {
  std::vector<int64_t> out;
  int64_t v = 0;
  bool in = false, neg = false;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      v = v * 10 + (c - '0');
      in = true;
    } else if (c == '-') {
      neg = true;
    } else {
      if (in) out.push_back(neg ? -v : v);
      v = 0;
      in = neg = false;
    }
  }
  if (in) out.push_back(neg ? -v : v);
  return out;
}

MemberRecord toMember(const detail::CollectiveTable& t, const detail::CollectiveRecord& c) {
  MemberRecord r;
  r.rank = c.rank;
  r.op = t.str(c.op);
  r.dtype = t.str(c.dtype);
  r.shape = parseShape(t.str(c.shape));
  r.numel = c.numel;
  r.bytes = c.bytes;
  r.callsite = t.str(c.callsite);
  r.step = c.step;
  r.layer = c.layer;
  r.enqueueNs = c.enqueueNs;
  if (c.hasStart()) r.startNs = c.startNs;
  if (c.hasEnd()) r.endNs = c.endNs;
  r.state = t.str(c.state);
  return r;
}

struct Progress {
  int64_t lastEnqueued = 0, lastStarted = 0, lastCompleted = 0;
  int64_t firstIncomplete = INT64_MAX;
  size_t lastRow = 0;  // row of lastEnqueued
};

struct GroupScan {
  std::map<int, Progress> byRank;
  std::vector<int64_t> mismatched;                      // seqs whose members disagree on op/size/dtype
  // (seq, row range) of each of the group's collectives, in seq order (the table's), for the seqs needed again. A
  // sorted vector, not a map: a large run has hundreds of thousands.
  std::vector<std::pair<int64_t, std::pair<size_t, size_t>>> rowsOf;
  size_t firstRow = SIZE_MAX, endRow = 0;  // the group's rows

  // The row range of `seq` ([0, 0) when the group has none).
  std::pair<size_t, size_t> rowsOfSeq(int64_t seq) const {
    auto it = std::lower_bound(rowsOf.begin(), rowsOf.end(), seq,
                               [](const auto& entry, int64_t s) { return entry.first < s; });
    return it != rowsOf.end() && it->first == seq ? it->second : std::pair<size_t, size_t>{0, 0};
  }
};

// One pass over the collectives: per group, each member's progress and the seqs whose members disagree.
std::map<std::string, GroupScan> scanGroups(const detail::CollectiveTable& table) {
  std::map<std::string, GroupScan> scans;
  uint32_t lastGroup = UINT32_MAX;  // the table comes a group at a time: its scan is looked up when it changes
  GroupScan* scan = nullptr;
  table.forEachCollective([&](size_t b, size_t e) {
    const detail::CollectiveRecord& first = table.rows[b];
    if (first.group != lastGroup) {
      scan = &scans[table.str(first.group)];
      lastGroup = first.group;
    }
    GroupScan& g = *scan;
    bool mismatch = false;
    for (size_t i = b; i < e; ++i) {
      const detail::CollectiveRecord& c = table.rows[i];
      mismatch = mismatch || !sameOp(table.str(c.op), table.str(first.op)) ||
                 (!sizesMayDiffer(table.str(first.op)) &&
                  (c.numel != first.numel || c.shape != first.shape || c.dtype != first.dtype));
      Progress& p = g.byRank[c.rank];
      if (c.seq >= p.lastEnqueued) {
        p.lastEnqueued = c.seq;
        p.lastRow = i;
      }
      if (table.started(c)) p.lastStarted = std::max(p.lastStarted, c.seq);
      if (table.completed(c)) p.lastCompleted = std::max(p.lastCompleted, c.seq);
      else p.firstIncomplete = std::min(p.firstIncomplete, c.seq);
    }
    if (mismatch) g.mismatched.push_back(first.seq);
    g.rowsOf.emplace_back(first.seq, std::pair{b, e});
    g.firstRow = std::min(g.firstRow, b);
    g.endRow = std::max(g.endRow, e);
  });
  return scans;
}

std::vector<MemberRecord> recordsOf(const detail::CollectiveTable& table, const GroupScan& g, int64_t seq) {
  std::vector<MemberRecord> recs;
  const auto [b, e] = g.rowsOfSeq(seq);
  for (size_t i = b; i < e; ++i) recs.push_back(toMember(table, table.rows[i]));
  return recs;
}

// A group's members, their progress, and the first seq some member has not completed (where the group is stuck),
// with the members missing from it and those waiting in it.
GroupDesync groupProgress(const std::string& name, const GroupScan& scan, const RunInfo& info,
                          const detail::CollectiveTable& table) {
  const auto& byRank = scan.byRank;
  GroupDesync gd;
  gd.group = name;
  if (const auto* g = info.group(name)) gd.members = g->ranks;
  for (auto& [rank, p] : byRank)
    if (std::find(gd.members.begin(), gd.members.end(), rank) == gd.members.end()) gd.members.push_back(rank);
  // Members this file holds nothing of (one rank's own file, a partial merge) cannot be judged.
  std::erase_if(gd.members, [&](int m) { return info.rank(m) == nullptr && !byRank.count(m); });
  std::sort(gd.members.begin(), gd.members.end());

  int64_t maxEnqueued = 0;
  int64_t stuck = INT64_MAX;
  for (int m : gd.members) {
    MemberProgress mp;
    mp.rank = m;
    auto it = byRank.find(m);
    if (it != byRank.end()) {
      mp.lastEnqueued = it->second.lastEnqueued;
      mp.lastStarted = it->second.lastStarted;
      mp.lastCompleted = it->second.lastCompleted;
      mp.lastRecord = toMember(table, table.rows[it->second.lastRow]);
      stuck = std::min(stuck, std::min(it->second.firstIncomplete, it->second.lastEnqueued + 1));
    } else {
      stuck = std::min<int64_t>(stuck, 1);
    }
    maxEnqueued = std::max(maxEnqueued, mp.lastEnqueued);
    gd.progress.push_back(mp);
  }
  // A pipeline message whose recv completed was delivered: its send stays open until the sender waits on its sends at
  // the end of its step (it may be held up elsewhere first), so that is not where the pair is stuck.
  if (isPointToPointGroup(name))
    for (; stuck != INT64_MAX && stuck <= maxEnqueued; ++stuck) {
      const auto recs = recordsOf(table, scan, stuck);
      const bool delivered = std::any_of(recs.begin(), recs.end(), [](const MemberRecord& r) {
        return r.op == "recv" && completed(r);
      });
      if (!delivered) break;
    }
  if (stuck != INT64_MAX && stuck <= maxEnqueued) {
    auto recs = recordsOf(table, scan, stuck);
    if (!recs.empty()) {
      gd.stuckSeq = stuck;
      gd.stuckRecords = std::move(recs);
      gd.stuckState = classify(gd.stuckRecords);
      for (int m : gd.members) {
        auto r = std::find_if(gd.stuckRecords.begin(), gd.stuckRecords.end(),
                              [&](const MemberRecord& x) { return x.rank == m; });
        if (r == gd.stuckRecords.end())
          gd.missingRanks.push_back(m);
        else if (!completed(*r))
          gd.waitingRanks.push_back(m);
      }
      if (gd.missingRanks.empty() && gd.waitingRanks.empty()) gd.stuckSeq.reset();  // a gap, not a hang
    }
  }
  return gd;
}

// For each member missing from the stuck collective: when it entered the same call site one step earlier, and the
// last span it recorded (what it was doing instead).
tracedb::Status addMissingRankContext(tracedb::Reader& reader, GroupDesync& gd) {
  for (MemberProgress& mp : gd.progress) {
    const bool missing = std::find(gd.missingRanks.begin(), gd.missingRanks.end(), mp.rank) != gd.missingRanks.end();
    if (!missing) continue;
    const MemberRecord& stuckRec = gd.stuckRecords.front();
    if (stuckRec.step > 0 && isPointToPointGroup(gd.group)) {
      // A pipeline pair carries every micro-batch's message from one call site, the same messages every step: the
      // same message one step earlier is one step's count of seqs back.
      Query q(reader,
              "SELECT enqueue_ns FROM collectives WHERE rank = ?1 AND group_name = ?2 AND seq = ?3 -"
              " (SELECT count(DISTINCT seq) FROM collectives WHERE group_name = ?2 AND step = ?4)",
              "table 'collectives'");
      q.bind(1, int64_t{mp.rank}).bind(2, std::string_view(gd.group)).bind(3, *gd.stuckSeq);
      q.bind(4, int64_t{stuckRec.step - 1});
      auto st = q.each([&](Query& row) {
        if (!row.isNull(0)) mp.previousStepEnqueueNs = row.i64(0);
      });
      if (!st) return st;
    } else if (stuckRec.step > 0 && !stuckRec.callsite.empty()) {
      Query q(reader,
              "SELECT min(enqueue_ns) FROM collectives"
              " WHERE rank = ? AND group_name = ? AND callsite = ? AND step = ?",
              "table 'collectives'");
      q.bind(1, int64_t{mp.rank}).bind(2, std::string_view(gd.group)).bind(3, std::string_view(stuckRec.callsite));
      q.bind(4, int64_t{stuckRec.step - 1});
      auto st = q.each([&](Query& row) {
        if (!row.isNull(0)) mp.previousStepEnqueueNs = row.i64(0);
      });
      if (!st) return st;
    }
    Query q(reader,
            "SELECT n.value, k.name, p.name, s.step, s.layer, s.begin_ns, s.begin_ns + s.dur_ns FROM spans s"
            " LEFT JOIN strings n ON n.id = s.name LEFT JOIN span_kinds k ON k.id = s.kind"
            " LEFT JOIN phases p ON p.id = s.phase WHERE s.rank = ? ORDER BY s.begin_ns DESC LIMIT 1",
            "table 'spans'");
    q.bind(1, int64_t{mp.rank});
    auto s = q.each([&](Query& row) {
      mp.lastSpan = LastSpan{row.text(0), row.text(1), row.text(2), row.i32(3), row.i32(4), row.i64(5), row.i64(6)};
    });
    if (!s) return s;
  }
  return tracedb::Status::ok();
}

// The group's mismatched seqs (the first 100), each member's record with the size it had one step earlier.
void addMismatches(const GroupScan& scan, const detail::CollectiveTable& table, GroupDesync& gd) {
  gd.mismatchCount = static_cast<int64_t>(scan.mismatched.size());
  // (rank, call site, step) → numel of the rank's first record there, for the mismatched records' history.
  std::map<std::tuple<int, uint32_t, int>, int64_t> firstNumel;
  if (!scan.mismatched.empty())
    for (size_t i = scan.firstRow; i < scan.endRow; ++i) {
      const detail::CollectiveRecord& c = table.rows[i];
      if (c.callsite != 0 && c.step >= 0) firstNumel.try_emplace({c.rank, c.callsite, c.step}, c.numel);
    }
  for (size_t i = 0; i < scan.mismatched.size() && i < 100; ++i) {
    SeqMismatch sm;
    sm.seq = scan.mismatched[i];
    const auto [b, e] = scan.rowsOfSeq(sm.seq);
    for (size_t row = b; row < e; ++row) {
      const detail::CollectiveRecord& c = table.rows[row];
      MemberRecord r = toMember(table, c);
      if (auto it = firstNumel.find({c.rank, c.callsite, c.step - 1}); it != firstNumel.end())
        r.previousNumel = it->second;
      sm.records.push_back(std::move(r));
    }
    sm.state = classify(sm.records);
    sm.next = recordsOf(table, scan, sm.seq + 1);
    gd.mismatches.push_back(std::move(sm));
  }
}

}  // namespace

MatchState classifyRecords(const std::vector<MemberRecord>& records) { return classify(records); }

tracedb::Result<DesyncReport> detail::analyzeDesync(tracedb::Reader& reader, const RunInfo& info,
                                                    const detail::CollectiveTable& table) {
  DesyncReport out;
  for (const auto& [name, scan] : scanGroups(table)) {
    GroupDesync gd = groupProgress(name, scan, info, table);
    if (auto s = addMissingRankContext(reader, gd); !s) return s;
    addMismatches(scan, table, gd);
    out.groups.push_back(std::move(gd));
  }
  return out;
}

tracedb::Result<DesyncReport> analyzeDesync(tracedb::Reader& reader, const RunInfo& info) {
  auto table = detail::loadCollectives(reader);
  if (!table) return table.status();
  return detail::analyzeDesync(reader, info, *table);
}

namespace {

using detail::field;

std::string describeRecord(const MemberRecord& r) {
  std::string s = r.op + " " + r.dtype + " [";
  for (size_t i = 0; i < r.shape.size(); ++i) s += (i ? "," : "") + std::to_string(r.shape[i]);
  s += "] (" + std::to_string(r.bytes) + " bytes)";
  return s;
}

std::string spanText(const LastSpan& s) {
  std::string t = s.name.empty() ? s.kind : s.name;
  if (!s.phase.empty() && s.phase != "none") t += " (" + s.phase + ")";
  if (s.layer >= 0) t += ", layer " + std::to_string(s.layer);
  if (s.step >= 0) t += ", step " + std::to_string(s.step);
  return t;
}

}  // namespace

namespace {

using RankGroups = std::map<int, const GroupDesync*>;

// Where each rank is blocked (waitingIn), and the first stuck collective each rank is missing from (firstMissing):
// the one it reached first a step earlier (its own clock: program order), else the one its peers reached first
// (their clocks, and 2 cores shared by 4 ranks can reorder two nearly simultaneous arrivals).
struct Blocked {
  RankGroups waitingIn, firstMissing;
};

Blocked whereRanksAreBlocked(const DesyncReport& report) {
  Blocked b;
  for (const GroupDesync& g : report.groups)
    for (int r : g.waitingRanks) b.waitingIn.emplace(r, &g);
  auto firstArrival = [](const GroupDesync& g) {
    int64_t t = INT64_MAX;
    for (const auto& r : g.stuckRecords) t = std::min(t, r.enqueueNs);
    return t;
  };
  auto previousStep = [](const GroupDesync& g, int rank) -> std::optional<int64_t> {
    for (const auto& p : g.progress)
      if (p.rank == rank) return p.previousStepEnqueueNs;
    return std::nullopt;
  };
  auto reachedBefore = [&](const GroupDesync& x, const GroupDesync& y, int rank) {
    const auto px = previousStep(x, rank), py = previousStep(y, rank);
    if (px && py && x.stuckRecords.front().step == y.stuckRecords.front().step) return *px < *py;
    return firstArrival(x) < firstArrival(y);
  };
  for (const GroupDesync& g : report.groups)
    for (int r : g.missingRanks) {
      auto [it, fresh] = b.firstMissing.emplace(r, &g);
      if (!fresh && reachedBefore(g, *it->second, r)) it->second = &g;
    }
  return b;
}

// What each missing rank of a stuck collective last did, as detail lines and cited rows.
void describeMissingRanks(const GroupDesync& g, Finding& fd) {
  for (int m : g.missingRanks) {
    const auto& mp = *std::find_if(g.progress.begin(), g.progress.end(), [&](const auto& p) { return p.rank == m; });
    std::string line = "rank " + std::to_string(m) + " never entered it: ";
    line += mp.lastEnqueued > 0 ? "its last collective is seq " + std::to_string(mp.lastEnqueued)
                                : "it recorded no collective in this group";
    if (mp.lastRecord && !mp.lastRecord->callsite.empty()) line += " (" + mp.lastRecord->callsite + ")";
    if (mp.lastSpan) line += "; its last span: " + spanText(*mp.lastSpan);
    fd.details.push_back(line);
    if (mp.lastEnqueued > 0)
      fd.cite("collectives", {field("rank", int64_t{m}), field("group_name", g.group), field("seq", mp.lastEnqueued)});
    if (mp.lastSpan)
      fd.cite("spans",
              {field("rank", int64_t{m}), field("begin_ns", mp.lastSpan->beginNs), field("name", mp.lastSpan->name)});
  }
}

// A hang is secondary (a consequence, graded error) when every rank missing from it is itself waiting in another
// stuck collective, or already failed to enter one the others reached earlier. Adds the detail lines that say so.
bool isSecondaryHang(const GroupDesync& g, const Blocked& blocked, Finding& fd) {
  bool secondary = !g.missingRanks.empty();
  for (int m : g.missingRanks) {
    auto it = blocked.waitingIn.find(m);
    if (it != blocked.waitingIn.end() && it->second != &g) {
      fd.details.push_back("rank " + std::to_string(m) + " is itself waiting in group " + it->second->group +
                           " seq " + std::to_string(*it->second->stuckSeq));
      continue;
    }
    const GroupDesync* earlier = blocked.firstMissing.at(m);
    if (earlier != &g) {
      fd.details.push_back("rank " + std::to_string(m) + " already failed to enter group " + earlier->group +
                           " seq " + std::to_string(*earlier->stuckSeq) + ", which the others reached earlier");
      continue;
    }
    secondary = false;
  }
  return secondary;
}

// The (src, dst) of a point-to-point pseudo-group "p2p-<src>-<dst>".
std::optional<std::pair<int, int>> p2pEnds(std::string_view group) {
  if (!isPointToPointGroup(group)) return std::nullopt;
  group.remove_prefix(4);
  const size_t dash = group.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const std::string src(group.substr(0, dash)), dst(group.substr(dash + 1));
  if (src.empty() || dst.empty() || src.find_first_not_of("0123456789") != std::string::npos ||
      dst.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::pair{std::atoi(src.c_str()), std::atoi(dst.c_str())};
}

// A transfer whose missing rank waits in a transfer of the same direction with a third rank: the peers disagree
// (p2p peer mismatch). Adds the detail line; true when found.
bool describePeerMismatch(const GroupDesync& g, const Blocked& blocked, Finding& fd) {
  const auto ends = p2pEnds(g.group);
  if (!ends) return false;
  bool found = false;
  for (int m : g.missingRanks) {
    auto it = blocked.waitingIn.find(m);
    if (it == blocked.waitingIn.end() || it->second == &g) continue;
    const auto other = p2pEnds(it->second->group);
    if (!other) continue;
    const std::string there = " (group " + it->second->group + " seq " + std::to_string(*it->second->stuckSeq) + ")";
    if (m == ends->second && other->second == m && other->first != ends->first) {
      fd.details.push_back("p2p peer mismatch: rank " + std::to_string(ends->first) + " sends to rank " +
                           std::to_string(m) + ", which waits to receive from rank " + std::to_string(other->first) +
                           " instead" + there);
      found = true;
    } else if (m == ends->first && other->first == m && other->second != ends->second) {
      fd.details.push_back("p2p peer mismatch: rank " + std::to_string(ends->second) + " waits to receive from rank " +
                           std::to_string(m) + ", which sends to rank " + std::to_string(other->second) + " instead" +
                           there);
      found = true;
    }
  }
  return found;
}

// The warning for ranks of an imported Flight Recorder folder that left no dump: what cannot be decided.
Finding missingDumpsFinding(const DesyncReport& report, const RunInfo& info) {
  Finding fd;
  fd.kind = FindingKind::Crash;
  fd.severity = Severity::Warning;
  fd.ranks = info.missingRankDumps;
  fd.rank = fd.ranks.front();
  fd.message = "no Flight Recorder dump of " + rankList(fd.ranks) +
               ": whether it entered its groups' collectives cannot be decided";
  for (const auto& group : info.groups) {
    std::vector<int> absent, present;
    for (int r : group.ranks)
      (std::find(fd.ranks.begin(), fd.ranks.end(), r) != fd.ranks.end() ? absent : present).push_back(r);
    if (absent.empty()) continue;
    std::string line = "group " + group.name + " (ranks " + formatRanks(group.ranks) + "): ";
    line += present.empty() ? "no dump of any member" : "compared among " + rankList(present) + " only";
    fd.details.push_back(line);
  }
  fd.details.push_back("still decided: mismatches (op, size, dtype, state) and hangs among the ranks that dumped");
  (void)report;
  fd.number("missing_dumps", static_cast<int64_t>(fd.ranks.size()));
  return fd;
}

// The hang finding of a group stuck at g.stuckSeq.
Finding hangFinding(const GroupDesync& g, const Blocked& blocked) {
  Finding fd;
  fd.kind = FindingKind::Hang;
  fd.severity = Severity::Critical;
  const MemberRecord* sample = g.stuckRecords.empty() ? nullptr : &g.stuckRecords.front();
  fd.collective = CollectiveRef{g.group, *g.stuckSeq, sample ? sample->op : ""};
  fd.rank = g.missingRanks.empty() ? -1 : g.missingRanks.front();
  fd.step = sample ? sample->step : -1;
  fd.layer = sample ? sample->layer : -1;
  fd.ranks = g.missingRanks;
  const std::string where = sample && !sample->callsite.empty() ? ": " + sample->callsite : "";
  fd.message =
      "group " + g.group + " (ranks " + formatRanks(g.members) + ") seq " + std::to_string(*g.stuckSeq) + where;
  if (!g.waitingRanks.empty()) fd.details.push_back(rankList(g.waitingRanks) + " entered it and never completed it");
  if (g.stuckState != MatchState::FullyMatched && g.stuckState != MatchState::StateMismatch &&
      g.stuckState != MatchState::Undecided)
    fd.details.push_back(std::string("the ranks that entered it disagree: ") + matchStateName(g.stuckState));
  for (const MemberRecord& r : g.stuckRecords) {
    fd.cite("collectives", {field("rank", int64_t{r.rank}), field("group_name", g.group), field("seq", *g.stuckSeq)});
    if (!r.callsite.empty() && sample && r.callsite != sample->callsite)
      fd.details.push_back("rank " + std::to_string(r.rank) + " was at: " + r.callsite);
  }
  describeMissingRanks(g, fd);
  const bool peerMismatch = describePeerMismatch(g, blocked, fd);
  const bool secondary = isSecondaryHang(g, blocked, fd);
  if (secondary) {
    fd.severity = Severity::Error;
    fd.details.push_back("a consequence of the hang it waits on, not a cause");
  }
  fd.number("stuck_seq", *g.stuckSeq);
  fd.number("secondary", int64_t{secondary});
  fd.number("missing_ranks", static_cast<int64_t>(g.missingRanks.size()));
  fd.number("waiting_ranks", static_cast<int64_t>(g.waitingRanks.size()));
  fd.number("match_state", std::string(matchStateName(g.stuckState)));
  if (peerMismatch) fd.number("p2p_peer_mismatch", int64_t{1});
  if (!g.missingRanks.empty()) fd.message += " — " + rankList(g.missingRanks) + " never entered it";
  return fd;
}

// The odd ones out of a mismatched collective: the ranks whose record differs from the majority. On a tie (two
// ranks that disagree): those whose size changed since the same call site a step before, when that tells one
// variant from the others; else all but the first variant. Sorted.
// The ranks that issued one collective more than the others before `m.seq`: their record of seq + 1 is what every
// rank outside their variant recorded at seq. Empty when no single variant is shifted so.
std::vector<int> shiftedRanks(const SeqMismatch& m, const std::map<std::string, std::vector<int>>& byDesc) {
  if (byDesc.size() != 2) return {};
  auto recordOf = [](const std::vector<MemberRecord>& recs, int rank) -> const MemberRecord* {
    for (const auto& r : recs)
      if (r.rank == rank) return &r;
    return nullptr;
  };
  std::vector<int> shifted;
  int shiftedVariants = 0;
  for (const auto& [desc, ranks] : byDesc) {
    const std::string& otherDesc = desc == byDesc.begin()->first ? std::next(byDesc.begin())->first
                                                                 : byDesc.begin()->first;
    bool all = true;
    std::string shiftedNext;
    for (int r : ranks) {
      const MemberRecord* next = recordOf(m.next, r);
      all = all && next && describeRecord(*next) == otherDesc;
      if (next) shiftedNext = describeRecord(*next);
    }
    // ... and the others did not simply issue the same call again next (a repetitive program: every rank's seq + 1
    // looks like its seq), which is no evidence of a shift.
    for (const auto& [otherD, otherRanks] : byDesc) {
      if (otherD == desc) continue;
      for (int o : otherRanks)
        if (const MemberRecord* next = recordOf(m.next, o); next && describeRecord(*next) == shiftedNext) all = false;
    }
    if (all) {
      ++shiftedVariants;
      shifted = ranks;
    }
  }
  return shiftedVariants == 1 ? shifted : std::vector<int>{};
}

std::vector<int> oddRanks(const SeqMismatch& m, const std::map<std::string, std::vector<int>>& byDesc) {
  if (auto shifted = shiftedRanks(m, byDesc); !shifted.empty()) return shifted;
  size_t most = 0;
  for (auto& [d, rs] : byDesc) most = std::max(most, rs.size());
  std::vector<int> odd;
  for (auto& [d, rs] : byDesc)
    if (rs.size() < most || byDesc.size() == 1) odd.insert(odd.end(), rs.begin(), rs.end());
  if (odd.empty()) {
    std::vector<int> changed;
    size_t changedVariants = 0;
    for (auto& [d, rs] : byDesc) {
      bool variantChanged = false;
      for (const auto& r : m.records)
        if (std::find(rs.begin(), rs.end(), r.rank) != rs.end() && r.previousNumel && *r.previousNumel != r.numel)
          variantChanged = true;
      if (variantChanged) {
        ++changedVariants;
        changed.insert(changed.end(), rs.begin(), rs.end());
      }
    }
    if (changedVariants > 0 && changedVariants < byDesc.size()) {
      odd = changed;
    } else {
      for (auto it = std::next(byDesc.begin()); it != byDesc.end(); ++it)
        odd.insert(odd.end(), it->second.begin(), it->second.end());
    }
  }
  std::sort(odd.begin(), odd.end());
  return odd;
}

// The desync finding of one mismatched (group, seq): critical when it is the stuck one.
Finding desyncFinding(const GroupDesync& g, const SeqMismatch& m) {
  Finding fd;
  fd.kind = FindingKind::Desync;
  const bool isStuck = g.stuckSeq && *g.stuckSeq == m.seq;
  fd.severity = isStuck ? Severity::Critical : Severity::Error;
  std::map<std::string, std::vector<int>> byDesc;
  for (const auto& r : m.records) byDesc[describeRecord(r)].push_back(r.rank);
  const std::vector<int> odd = oddRanks(m, byDesc);
  fd.rank = odd.empty() ? -1 : odd.front();
  fd.ranks = odd;
  const MemberRecord& first = m.records.front();
  fd.collective = CollectiveRef{g.group, m.seq, first.op};
  fd.step = first.step;
  fd.layer = first.layer;
  fd.message = std::string(matchStateName(m.state)) + " in group " + g.group + " seq " + std::to_string(m.seq) + ": " +
               rankList(odd) + " disagree" + (odd.size() > 1 ? "" : "s") + " with the others";
  for (auto& [d, rs] : byDesc) {
    std::string cs;
    for (const auto& r : m.records)
      if (r.rank == rs.front() && !r.callsite.empty()) cs = " at " + r.callsite;
    fd.details.push_back(rankList(rs) + ": " + d + cs);
  }
  if (const auto shifted = shiftedRanks(m, byDesc); !shifted.empty())
    fd.details.push_back(rankList(shifted) + " issued one collective more: " +
                         (shifted.size() > 1 ? "their" : "its") + " seq " + std::to_string(m.seq + 1) +
                         " is what the others issued at seq " + std::to_string(m.seq));
  for (const auto& r : m.records)
    fd.cite("collectives", {field("rank", int64_t{r.rank}), field("group_name", g.group), field("seq", m.seq)});
  fd.number("match_state", std::string(matchStateName(m.state)));
  fd.number("mismatched_seqs_in_group", g.mismatchCount);
  return fd;
}

}  // namespace

std::vector<Finding> desyncFindings(const DesyncReport& report, const RunInfo& info) {
  std::vector<Finding> out;
  const Blocked blocked = whereRanksAreBlocked(report);
  for (const GroupDesync& g : report.groups) {
    if (g.stuckSeq) out.push_back(hangFinding(g, blocked));
    for (const SeqMismatch& m : g.mismatches) {
      if (m.state == MatchState::FullyMatched || m.state == MatchState::Undecided ||
          m.state == MatchState::StateMismatch)
        continue;
      Finding fd = desyncFinding(g, m);
      // Sequence numbers an importer inferred from each rank's order: two threads' collectives (DDP's all-reduces
      // on the autograd thread, all-to-alls on the main thread) may interleave differently on two ranks, and the
      // same seq then pairs different calls. Not evidence of a desync: a figure, said so.
      if (std::find(info.seqByOrder.begin(), info.seqByOrder.end(), g.group) != info.seqByOrder.end() && !g.stuckSeq) {
        fd.severity = Severity::Info;
        fd.details.insert(fd.details.begin(),
                          "the trace carries no sequence numbers: seq is each rank's order of enqueueing in " + g.group +
                              ", and ranks that issue collectives from two threads may order them differently; no "
                              "evidence of a desync (a trace with the process group's Seq, PyTorch >= 2.1, decides)");
        fd.number("seq_by_order", int64_t{1});
      }
      out.push_back(std::move(fd));
    }
  }
  if (!info.missingRankDumps.empty()) out.push_back(missingDumpsFinding(report, info));
  return out;
}

}  // namespace tpscope::analysis
