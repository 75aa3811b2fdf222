#include "tpscope/analysis/live_stall.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::analysis {

using tracedb::CollectiveRow;
using tracedb::CollectiveState;

const char* stallKindName(StallKind kind) {
  switch (kind) {
    case StallKind::Waiting: return "waiting";
    case StallKind::Desync: return "desync";
    case StallKind::Stuck: return "stuck";
  }
  return "waiting";
}

const char* missingStateName(MissingState state) {
  switch (state) {
    case MissingState::Unknown: return "unknown";
    case MissingState::Entering: return "entering";
    case MissingState::Compute: return "compute";
    case MissingState::Data: return "data";
    case MissingState::Inside: return "inside";
    case MissingState::Blocked: return "blocked";
    case MissingState::Exited: return "exited";
  }
  return "unknown";
}

std::vector<OpenSpanInfo> parseOpenSpans(std::string_view json) {
  std::vector<OpenSpanInfo> out;
  const auto j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (!e.is_object()) continue;
    OpenSpanInfo o;
    o.thread = e.value("thread", 0);
    o.name = e.value("name", "");
    o.kind = e.value("kind", 0);
    o.layer = e.value("layer", -1);
    o.beginNs = e.value("begin_ns", int64_t{0});
    out.push_back(std::move(o));
  }
  return out;
}

namespace {

// What kind of span an open one is (meta open_spans carries the probes' SpanKind as its number).
using tracedb::SpanKind;
SpanKind kindOf(const OpenSpanInfo& o) {
  return static_cast<SpanKind>(o.kind);
}

constexpr int64_t kStuckStepMultiple = 10;  // open ≥ this many of its median steps (and ≥ `after`): stuck

// The innermost spans open on the rank now, the step's left out: of any kind (a collective's or a wait's says it is
// in a collective of its own), and of its own work (not a collective's or a wait's: those are the collective
// analysis' business). One pass over the open spans.
struct Innermost {
  const OpenSpanInfo* any = nullptr;
  const OpenSpanInfo* work = nullptr;
};

Innermost innermostOpen(const LiveRankState& r) {
  Innermost in;
  for (const OpenSpanInfo& o : r.open) {
    const SpanKind k = kindOf(o);
    if (k == SpanKind::Step) continue;
    if (in.any == nullptr || o.beginNs >= in.any->beginNs) in.any = &o;
    if (k != SpanKind::Comm && k != SpanKind::Wait && (in.work == nullptr || o.beginNs >= in.work->beginNs))
      in.work = &o;
  }
  return in;
}

// The state a missing rank's own open span gives it (Entering without one, Unknown where its file does not say).
MissingState stateInside(const MissingRank& m) {
  if (!m.inside) return m.openKnown ? MissingState::Entering : MissingState::Unknown;
  const SpanKind k = kindOf(*m.inside);
  return k == SpanKind::Compute ? MissingState::Compute
         : k == SpanKind::Data  ? MissingState::Data
                                : MissingState::Inside;
}

// Where a rank that has not entered the collective is (MissingRank::state).
void place(MissingRank& m, const LiveRankState& r, int64_t nowNs, int64_t afterNs) {
  m.medianStepNs = r.medianStepNs;
  m.openKnown = r.openKnown;
  const Innermost open = innermostOpen(r);
  // In a collective of its own (not yet seen blocked there: it entered less than `after` ago, or its records grow).
  m.inCollective = open.any != nullptr && (kindOf(*open.any) == SpanKind::Comm || kindOf(*open.any) == SpanKind::Wait);
  if (const OpenSpanInfo* in = open.work; in != nullptr && !m.exited) {
    m.inside = *in;
    m.insideNs = std::max<int64_t>(0, nowNs - in->beginNs);
    m.stuck = m.insideNs >= afterNs && (r.medianStepNs <= 0 || m.insideNs >= kStuckStepMultiple * r.medianStepNs);
  }
  m.state = m.exited ? MissingState::Exited : m.blockedIn ? MissingState::Blocked : stateInside(m);
}

// A missing rank inside its own work for less than kBusyStepMultiple of its median steps.
constexpr int64_t kBusyStepMultiple = 2;
// A missing rank in a collective of its own that it is not yet seen blocked in: the next polls tell whether it is
// blocked there (then this wait is a consequence) or passes through; naming it as the culprit now would be wrong.
bool busy(const MissingRank& m) {
  if (m.blockedIn || m.exited) return false;
  if (m.inCollective) return true;
  return m.inside && !m.stuck && m.medianStepNs > 0 && m.insideNs < kBusyStepMultiple * m.medianStepNs;
}

bool completed(const CollectiveRow& c) {
  return c.state == CollectiveState::Completed ||
         (c.endNs && c.state != CollectiveState::TimedOut && c.state != CollectiveState::Failed);
}

MemberRecord memberOf(const CollectiveRow& c) {
  MemberRecord m;
  m.rank = c.rank;
  m.op = c.op;
  m.dtype = c.dtype;
  m.callsite = c.callsite;
  m.state = std::string(tracedb::collectiveStateName(c.state));
  m.shape = c.shape;
  m.numel = c.numel;
  m.bytes = c.bytes;
  m.step = c.step;
  m.layer = c.layer;
  m.enqueueNs = c.enqueueNs;
  m.startNs = c.startNs;
  m.endNs = c.endNs;
  return m;
}

// The rank's collective of the highest seq in `group`.
const CollectiveRow* newestIn(const LiveRankState& r, const std::string& group) {
  const CollectiveRow* newest = nullptr;
  for (const CollectiveRow& c : r.newest)
    if (c.group == group && (newest == nullptr || c.seq > newest->seq)) newest = &c;
  return newest;
}

// The rank's record of (group, seq) among those read (its newest and first incomplete ones).
const CollectiveRow* recordOf(const LiveRankState& r, const std::string& group, int64_t seq) {
  for (const CollectiveRow& c : r.newest)
    if (c.group == group && c.seq == seq) return &c;
  return nullptr;
}

struct Blocked {
  const CollectiveRow* site = nullptr;  // the first collective of the group it has not completed
  int64_t sinceNs = 0;                  // when it entered the last one (its wait began no earlier)
};

// Where a rank is blocked: silent for `after`, its latest-entered incomplete collective entered `after` ago; the site
// is that group's first incomplete one (an async collective before it is the one its peers may be missing from).
std::optional<Blocked> blockedIn(const LiveRankState& r, int64_t nowNs, int64_t afterNs) {
  if (!r.seen || r.exited || r.quietNs < afterNs) return std::nullopt;
  const CollectiveRow* latest = nullptr;
  for (const CollectiveRow& c : r.newest)
    if (!completed(c) && (latest == nullptr || c.enqueueNs > latest->enqueueNs)) latest = &c;
  if (latest == nullptr || nowNs - latest->enqueueNs < afterNs) return std::nullopt;
  Blocked b{latest, latest->enqueueNs};
  for (const CollectiveRow& c : r.newest)
    if (c.group == latest->group && !completed(c) && c.seq < b.site->seq) b.site = &c;
  return b;
}

std::string seconds(int64_t ns) { return text::fixed(static_cast<double>(ns) * 1e-9, 1) + " s"; }

// "embedding VocabParallel forward all-reduce, step 5" (the call site names the op; the op where none was recorded)
std::string what(const CollectiveRow& c) {
  std::string s = c.callsite.empty() ? c.op : c.callsite;
  if (c.step >= 0) s += ", step " + std::to_string(c.step);
  return s;
}

std::string missingText(const MissingRank& m, const std::string& group) {
  std::string s = "rank " + std::to_string(m.rank);
  if (m.exited) return s + " has exited";
  s += " has not entered it";
  if (m.inside && m.state != MissingState::Blocked) {
    if (m.stuck)
      s += m.state == MissingState::Compute ? ": stuck in compute,"
           : m.state == MissingState::Data  ? ": stuck in data loading,"
                                            : ": stuck,";
    else
      s += ":";
    s += " inside \"" + m.inside->name + "\"" +
         (m.inside->layer >= 0 ? " (layer " + std::to_string(m.inside->layer) + ")" : std::string()) + " for " +
         seconds(m.insideNs);
    if (m.medianStepNs > 0 && m.insideNs >= m.medianStepNs)
      s += " (" + text::fixed(static_cast<double>(m.insideNs) / static_cast<double>(m.medianStepNs), 0) +
           "× its median step, " + text::ms(static_cast<double>(m.medianStepNs)) + " ms)";
    else if (m.medianStepNs > 0)
      s += " (its median step: " + text::ms(static_cast<double>(m.medianStepNs)) + " ms)";
  } else if (m.state == MissingState::Entering) {
    s += ": no span of its own open (on its way in, or in code tpscope does not record)";
  }
  s += " (last: ";
  s += m.last ? "seq " + std::to_string(m.last->seq) + " " + what(*m.last) : "no collective in " + group;
  if (m.blockedIn)
    s += "; itself blocked in " + m.blockedIn->group + " seq " + std::to_string(m.blockedIn->seq) + " (" +
         what(*m.blockedIn) + ")";
  else if (m.lastSpan)
    s += "; span \"" + m.lastSpan->name + "\"" +
         (m.lastSpan->span.step >= 0 ? " step " + std::to_string(m.lastSpan->span.step) : std::string()) +
         ", silent " + seconds(m.quietNs);
  else
    s += "; silent " + seconds(m.quietNs);
  return s + ")";
}

}  // namespace

bool LiveStall::secondary() const {
  return kind == StallKind::Waiting && !missing.empty() &&
         std::all_of(missing.begin(), missing.end(), [](const MissingRank& m) { return m.blockedIn.has_value(); });
}

std::string LiveStall::key() const {
  std::string k = std::string(stallKindName(kind)) + "|" + group + "|" + std::to_string(seq) + "|";
  for (const auto& b : blocked) k += std::to_string(b.rank) + ",";
  k += "|";
  for (const auto& m : missing)
    k += std::to_string(m.rank) + ":" + missingStateName(m.state) + (m.stuck ? "!" : "") + ",";
  return k;
}

std::vector<LiveStall> detectStalls(std::span<const LiveGroup> groups, std::span<const LiveRankState> ranks,
                                    int64_t nowNs, const LiveStallOptions& options) {
  std::map<int, const LiveRankState*> byRank;
  for (const LiveRankState& r : ranks) byRank[r.rank] = &r;
  std::map<int, Blocked> blockedAt;
  for (const LiveRankState& r : ranks)
    if (auto b = blockedIn(r, nowNs, options.afterNs)) blockedAt[r.rank] = *b;
  if (blockedAt.empty()) return {};

  // (group, seq) → the ranks blocked in it.
  std::map<std::pair<std::string, int64_t>, std::vector<int>> sites;
  for (auto& [rank, b] : blockedAt) sites[{b.site->group, b.site->seq}].push_back(rank);

  std::vector<LiveStall> out;
  for (auto& [site, blockedRanks] : sites) {
    const auto& [group, seq] = site;
    LiveStall st;
    st.group = group;
    st.seq = seq;
    st.record = *blockedAt[blockedRanks.front()].site;
    int64_t lastEntered = 0;
    for (int r : blockedRanks) {
      const Blocked& b = blockedAt[r];
      st.blocked.push_back({r, nowNs - b.sinceNs});
      lastEntered = std::max(lastEntered, b.sinceNs);
    }
    st.blockedNs = nowNs - lastEntered;

    std::vector<int> members;
    if (auto g = std::find_if(groups.begin(), groups.end(), [&](const LiveGroup& x) { return x.name == group; });
        g != groups.end())
      members = g->ranks;
    for (int r : blockedRanks)
      if (std::find(members.begin(), members.end(), r) == members.end()) members.push_back(r);
    std::sort(members.begin(), members.end());

    std::vector<MemberRecord> entered;
    bool allBlocked = true;
    for (int m : members) {
      auto it = byRank.find(m);
      if (it == byRank.end() || !it->second->seen) {
        ++st.unwatched;
        continue;
      }
      const LiveRankState& rs = *it->second;
      const CollectiveRow* newest = newestIn(rs, group);
      if (rs.exited || newest == nullptr || newest->seq < seq) {
        MissingRank mr;
        mr.rank = m;
        mr.exited = rs.exited;
        if (newest != nullptr) mr.last = *newest;
        if (auto b = blockedAt.find(m); b != blockedAt.end()) mr.blockedIn = *b->second.site;
        mr.lastSpan = rs.lastSpan;
        mr.quietNs = rs.quietNs;
        place(mr, rs, nowNs, options.afterNs);
        st.missing.push_back(std::move(mr));
        allBlocked = false;
      } else if (const CollectiveRow* rec = recordOf(rs, group, seq); rec != nullptr) {
        entered.push_back(memberOf(*rec));
        st.records.push_back(*rec);
        allBlocked = allBlocked && blockedAt.count(m) != 0;
      } else {
        allBlocked = false;  // it went past seq: its peers' record of it is still to be flushed, or a state mismatch
      }
    }
    const MatchState match = classifyRecords(entered);
    // Every missing rank busy with its own work for less than two of its median steps (a pipeline stage in a long
    // pass, a rank in a slow but normal operation): that is the work, not a stall. Said when it lasts longer.
    if (!st.missing.empty() && std::all_of(st.missing.begin(), st.missing.end(), busy)) continue;
    if (!st.missing.empty()) {
      st.kind = StallKind::Waiting;
    } else if (match == MatchState::CollectiveTypeMismatch || match == MatchState::SizeMismatch ||
               match == MatchState::DtypeMismatch) {
      st.kind = StallKind::Desync;
      st.match = match;
    } else if (allBlocked && !isPointToPointGroup(group)) {
      st.kind = StallKind::Stuck;
    } else {
      continue;  // a member is on its way through: nothing to say yet
    }
    if (st.kind != StallKind::Desync) st.records.clear();
    out.push_back(std::move(st));
  }
  // A missing rank "itself blocked" where no stall is reported is not waiting on anyone: e.g. a pipeline send whose
  // receiver has the data, left open because the rank stalled before it waited on it. The wait on it is the cause.
  for (LiveStall& st : out)
    for (MissingRank& m : st.missing)
      if (m.blockedIn && std::none_of(out.begin(), out.end(), [&](const LiveStall& o) {
            return o.group == m.blockedIn->group && o.seq == m.blockedIn->seq;
          }))
      {
        m.blockedIn.reset();
        m.state = stateInside(m);
      }
  std::stable_sort(out.begin(), out.end(), [](const LiveStall& a, const LiveStall& b) {
    return std::tuple(a.secondary(), a.group, a.seq) < std::tuple(b.secondary(), b.group, b.seq);
  });
  return out;
}

std::string stallLine(const LiveStall& st) {
  std::string s;
  switch (st.kind) {
    case StallKind::Waiting: s = "WAITING  "; break;
    case StallKind::Desync: s = "DESYNC   "; break;
    case StallKind::Stuck: s = "STUCK    "; break;
  }
  s += st.group + " seq " + std::to_string(st.seq) + " (" + what(st.record) + "): ";
  std::vector<int> blocked;
  for (const StalledRank& b : st.blocked) blocked.push_back(b.rank);
  s += rankList(blocked) + " blocked " + seconds(st.blockedNs);
  if (st.kind == StallKind::Waiting) {
    for (const MissingRank& m : st.missing) s += "; " + missingText(m, st.group);
    if (st.secondary()) s += " — a consequence of the stall named first";
  } else if (st.kind == StallKind::Desync) {
    s += "; the members disagree (" + std::string(matchStateName(st.match)) + "):";
    for (size_t i = 0; i < st.records.size(); ++i) {
      const CollectiveRow& c = st.records[i];
      s += std::string(i ? "," : "") + " rank " + std::to_string(c.rank) + " " + c.op + " " + c.dtype + " numel " +
           std::to_string(c.numel);
    }
  } else {
    s += "; every member entered it and none completed";
  }
  if (st.unwatched > 0) s += " (" + std::to_string(st.unwatched) + " member(s) on other nodes not watched here)";
  return s;
}

std::string resumedLine(const LiveStall& before, double blockedS) {
  std::string s = "RESUMED  " + before.group + " seq " + std::to_string(before.seq) + " after " +
                  text::fixed(blockedS, 1) + " s";
  if (before.kind == StallKind::Waiting && !before.missing.empty()) {
    std::vector<int> late;
    for (const auto& m : before.missing) late.push_back(m.rank);
    s += ": " + rankList(late) + " entered it late (a straggler, not a hang)";
  } else {
    s += ": the collective completed";
  }
  return s;
}

}  // namespace tpscope::analysis
