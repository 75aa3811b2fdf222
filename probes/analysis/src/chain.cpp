#include "tpscope/analysis/chain.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "evidence_util.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::analysis {

namespace {

using detail::field;

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A number of the finding's evidence as T (an integer or a real, either stored), or `fallback`.
template <class T>
T numberAs(const Finding& fd, const char* name, T fallback) {
  for (const auto& n : fd.evidence.numbers)
    if (n.name == name) {
      if (const auto* i = std::get_if<int64_t>(&n.value)) return static_cast<T>(*i);
      if (const auto* d = std::get_if<double>(&n.value)) return static_cast<T>(*d);
    }
  return fallback;
}

int64_t numberOr(const Finding& fd, const char* name, int64_t fallback) { return numberAs<int64_t>(fd, name, fallback); }

bool secondary(const Finding& fd) { return numberOr(fd, "secondary", 0) != 0; }

bool isKind(const Finding& fd, FindingKind k) { return fd.kind == k; }

bool origin(const Finding& fd) { return fd.kind == FindingKind::NanOrigin || fd.kind == FindingKind::InfOrigin; }

// A stuck collective, or a stuck pipeline message (a hang on a point-to-point pair, named by stage and micro-batch).
bool stuck(const Finding& fd) { return fd.kind == FindingKind::Hang || fd.kind == FindingKind::PipelineHang; }

// The chain's view of the run: what the rules and the sizes read.
struct Ctx {
  const std::vector<Finding>& all;
  const ChainInputs& in;

  const GroupDesync* group(const std::string& name) const {
    if (in.desync == nullptr) return nullptr;
    for (const auto& g : in.desync->groups)
      if (g.group == name) return &g;
    return nullptr;
  }
  std::vector<int> members(const std::string& name) const {
    if (in.info != nullptr)
      if (const auto* g = in.info->group(name); g != nullptr && !g->ranks.empty()) return g->ranks;
    if (const auto* g = group(name)) return g->members;
    return {};
  }
  const RankStraggling* straggling(int rank) const {
    if (in.collectives == nullptr) return nullptr;
    for (const auto& r : in.collectives->stragglers.ranks)
      if (r.rank == rank) return &r;
    return nullptr;
  }
  int64_t steps() const { return in.collectives ? std::max<int64_t>(1, in.collectives->stragglers.steps) : 1; }
  double meanStepNs() const {
    const Breakdown* b = in.breakdown;
    if (b == nullptr || b->steps.empty()) return 0;
    return static_cast<double>(b->run.stepNs) / static_cast<double>(b->steps.size());
  }
  int lastStep() const {
    int s = -1;
    if (in.info != nullptr)
      for (const auto& e : in.info->spanExtents) s = std::max(s, e.lastStep);
    for (const Finding& fd : all) s = std::max(s, fd.step);
    return s;
  }
  // How long the ranks that entered a stuck (group, seq) sat in it: from its first arrival to the end of the run.
  int64_t hangWaitNs(const Finding& hang) const {
    if (!hang.collective || in.info == nullptr) return -1;
    const GroupDesync* g = group(hang.collective->group);
    if (g == nullptr || !g->stuckSeq || *g->stuckSeq != hang.collective->seq || g->stuckRecords.empty()) return -1;
    int64_t first = INT64_MAX;
    for (const auto& r : g->stuckRecords) first = std::min(first, r.enqueueNs);
    // Until the job ended: the ranks' own end (the stop that ended the hang) where the file has it, else the last
    // record — which a hang's ranks stop writing when they block.
    int64_t end = in.info->endNs;
    for (const tracedb::RankInfo& r : in.info->ranks)
      if (r.endNs) end = std::max(end, *r.endNs);
    return std::max<int64_t>(0, end - first);
  }
};

// ---- Causal rules between findings: does finding `c` cause finding `e`, and what shows it? ----
// Each rule returns the connection (chain.h, LinkReason) or nothing: a rule that cannot cite what connects the two
// does not link them.

using Reason = std::optional<LinkReason>;

EvidenceRow collectiveRow(int rank, const std::string& group, int64_t seq) {
  return {"collectives", {field("rank", int64_t{rank}), field("group_name", group), field("seq", seq)}};
}

EvidenceRow rankRow(int rank) { return {"ranks", {field("rank", int64_t{rank})}}; }

// The rows of `fd`'s evidence from `table` (at most `n`).
std::vector<EvidenceRow> rowsOf(const Finding& fd, const std::string& table, size_t n = 4) {
  std::vector<EvidenceRow> out;
  for (const auto& r : fd.evidence.rows)
    if (r.table == table && out.size() < n) out.push_back(r);
  return out;
}

std::string collectiveText(const CollectiveRef& c) {
  return (c.op.empty() ? std::string("collective") : c.op) + " " + c.group + " seq " + std::to_string(c.seq);
}

Reason desyncCauses(const Ctx& x, const Finding& c, const Finding& e) {
  if (!isKind(c, FindingKind::Desync) || !c.collective) return {};
  const CollectiveRef& at = *c.collective;
  if (stuck(e)) {
    if (!e.collective || e.collective->group != at.group || e.collective->seq < at.seq) return {};
    LinkReason r{"the mismatched " + collectiveText(at) + " never completed, so " + at.group +
                     " could not reach seq " + std::to_string(e.collective->seq),
                 rowsOf(c, "collectives")};
    return r;
  }
  if (isKind(e, FindingKind::Crash)) {
    // Gloo aborts every member on the mismatched collective: the member's last collective is in the group, at the
    // mismatched seq or the one before (the abort came while it waited in it).
    if (!contains(x.members(at.group), e.rank)) return {};
    if (!e.collective || e.collective->group != at.group || e.collective->seq < at.seq - 1) return {};
    return LinkReason{"rank " + std::to_string(e.rank) + " died in " + at.group + " at seq " +
                          std::to_string(e.collective->seq) + ", on the mismatched collective (Gloo aborts its members)",
                      {collectiveRow(e.rank, at.group, e.collective->seq), rankRow(e.rank)}};
  }
  return {};
}

// A rank that died (critical) never enters its next collectives. One that only stopped recording early (error) is
// the other way round: stuck outside any collective, it is the missing rank of a hang, which names it better.
Reason crashCauses(const Finding& c, const Finding& e) {
  if (!(isKind(c, FindingKind::Crash) && c.severity == Severity::Critical && c.rank >= 0 && stuck(e) &&
        contains(e.ranks, c.rank)))
    return {};
  std::string where = e.collective ? " " + collectiveText(*e.collective) : std::string();
  return LinkReason{"rank " + std::to_string(c.rank) + " died, and it is the rank missing from" + where,
                    {rankRow(c.rank)}};
}

Reason hangCauses(const Ctx& x, const Finding& c, const Finding& e) {
  if (!stuck(c)) return {};
  if (isKind(e, FindingKind::Crash) && e.severity != Severity::Critical) {
    if (!(c.severity == Severity::Critical && contains(c.ranks, e.rank))) return {};
    return LinkReason{"rank " + std::to_string(e.rank) + " is missing from the stuck " +
                          (c.collective ? collectiveText(*c.collective) : std::string("collective")) +
                          ": it stopped recording while its peers waited",
                      {rankRow(e.rank)}};
  }
  if (!stuck(e) || !secondary(e)) return {};
  if (e.ranks.empty() || !c.collective) return {};
  std::vector<int> held = c.ranks;  // missing from c, or waiting in it
  const GroupDesync* g = x.group(c.collective->group);
  if (g != nullptr) held.insert(held.end(), g->waitingRanks.begin(), g->waitingRanks.end());
  if (!std::all_of(e.ranks.begin(), e.ranks.end(), [&](int r) { return contains(held, r); })) return {};
  LinkReason r{rankList(e.ranks) + (e.ranks.size() == 1 ? " is" : " are") + " held in the stuck " +
                   collectiveText(*c.collective) + " (waiting in it or missing from it)",
               {}};
  if (g != nullptr)
    for (const auto& rec : g->stuckRecords)
      if (contains(e.ranks, rec.rank) && r.rows.size() < 4)
        r.rows.push_back(collectiveRow(rec.rank, c.collective->group, c.collective->seq));
  return r;
}

// The hop of the spread of origin `c` that reached `rank`, if any.
const SpreadHop* hopTo(const Ctx& x, const Finding& c, int rank) {
  const NonFiniteReport* nf = incidentAt(x.in.nonfinite, c.rank, c.step);
  if (nf == nullptr) return nullptr;
  for (const auto& h : nf->spread)
    if (contains(h.toRanks, rank)) return &h;
  return nullptr;
}

Reason originCauses(const Ctx& x, const Finding& c, const Finding& e) {
  if (!origin(c) || c.severity != Severity::Critical || c.step < 0) return {};
  if (!(isKind(e, FindingKind::GradSpike) || isKind(e, FindingKind::LossSpike) ||
        isKind(e, FindingKind::ReplicaDivergence)))
    return {};
  // From the next incident's origin on (a value born anew after a clean step, nonfinite.h), the values are its.
  if (e.step < c.step || e.step >= numberOr(c, "next_origin_step", INT64_MAX)) return {};
  const std::string value = c.kind == FindingKind::NanOrigin ? "NaN" : "Inf";
  if (e.rank == c.rank || e.rank < 0)  // the origin's own values, or a run-wide value its values enter
    return LinkReason{"rank " + std::to_string(c.rank) + " held the " + value + " from step " + std::to_string(c.step) +
                          (e.rank < 0 ? ", and the run-wide value is computed from every rank's" : ""),
                      {{"step_stats", {field("rank", int64_t{c.rank}), field("step", int64_t{e.step})}}}};
  if (!contains(c.ranks, e.rank)) return {};  // the origin's receivers: ranks its spread path reached (nonfinite.h)
  const SpreadHop* h = hopTo(x, c, e.rank);
  if (h == nullptr)
    return LinkReason{"the " + value + " reached rank " + std::to_string(e.rank) + " by the origin's spread path",
                      rowsOf(c, "collectives", 2)};
  if (h->step > e.step) return {};
  return LinkReason{"the " + value + " reached rank " + std::to_string(e.rank) + " by " + collectiveText(h->collective) +
                        " at step " + std::to_string(h->step),
                    {collectiveRow(h->fromRank, h->collective.group, h->collective.seq)}};
}

std::string textOr(const Finding& fd, const char* name) {
  for (const auto& n : fd.evidence.numbers)
    if (n.name == name)
      if (const auto* s = std::get_if<std::string>(&n.value)) return *s;
  return {};
}

// Replicas that a NaN or one rank's gradient spike parted (sdc.h, explainDivergences): the analysis that found the
// connection names the cause on the divergence (cause, cause_rank, cause_step), with the rows that show the fault on
// the suspect.
Reason explainedBy(const Finding& c, const Finding& e) {
  if (!(isKind(e, FindingKind::SilentCorruption) && secondary(e) && textOr(e, "cause") == findingKindName(c.kind) &&
        numberOr(e, "cause_rank", -2) == c.rank && numberOr(e, "cause_step", -2) == c.step && c.step >= 0))
    return {};
  LinkReason r{"the copies part on " + rankList(e.ranks.empty() ? std::vector<int>{e.rank} : e.ranks) + " from step " +
                   std::to_string(e.step) + ", computed from rank " + std::to_string(c.rank) + "'s " +
                   std::string(findingKindName(c.kind)) + " of step " + std::to_string(c.step),
               {}};
  for (const auto& row : e.evidence.rows)
    if (row.table != "alerts" && r.rows.size() < 4) r.rows.push_back(row);
  return r;
}

// The ranks that hold the corrupted copy: the suspect, or every suspect without a majority.
std::vector<int> suspects(const Finding& fd) {
  std::vector<int> out = fd.ranks;
  if (fd.rank >= 0 && !contains(out, fd.rank)) out.push_back(fd.rank);
  return out;
}

// A process group that carries values from a rank of `from` to a rank of `to` that `from` does not hold (a TP group
// sums partial results, a pipeline pair passes activations, a DP group averages gradients); null if none.
const tracedb::GroupInfo* channel(const Ctx& x, const std::vector<int>& from, const std::vector<int>& to) {
  if (x.in.info == nullptr) return nullptr;
  for (const auto& g : x.in.info->groups) {
    const bool src = std::any_of(from.begin(), from.end(), [&](int r) { return contains(g.ranks, r); });
    const bool dst = std::any_of(to.begin(), to.end(), [&](int r) { return contains(g.ranks, r) && !contains(from, r); });
    if (src && dst) return &g;
  }
  return nullptr;
}

// Corrupted state found on a rank feeds everything computed from it afterwards: a bit flip in a weight's exponent turns
// into a NaN or a spike there (or on the ranks it reaches) at the check's step or later. The flip happened at most
// one check window before the step the finding names, so a consequence may begin that early. A divergence that
// another fault explains is that fault's consequence and causes nothing of its own.
Reason sdcCauses(const Ctx& x, const Finding& c, const Finding& e) {
  if (!isKind(c, FindingKind::SilentCorruption) || c.step < 0 || secondary(c)) return {};
  // Corrupted values travel: a pipeline stage fed by the corrupted copy's activations, a TP peer summing its partial
  // results, diverge later (a step after at the earliest) — on ranks the first incident does not name, joined to a
  // suspect by a process group that carries values between them.
  if (isKind(e, FindingKind::SilentCorruption)) {
    if (e.step <= c.step) return {};
    const auto* g = channel(x, suspects(c), suspects(e));
    if (g == nullptr) return {};
    return LinkReason{"process group " + g->name + " carries values from " + rankList(suspects(c)) + " to " +
                          rankList(suspects(e)),
                      rowsOf(e, "alerts", 2)};
  }
  if (!(origin(e) || isKind(e, FindingKind::GradSpike) || isKind(e, FindingKind::LossSpike) ||
        isKind(e, FindingKind::ReplicaDivergence)))
    return {};
  const int64_t window = std::max<int64_t>(0, c.step - numberOr(c, "earliest_step", c.step));
  if (e.step < c.step - window || !(e.rank < 0 || contains(suspects(c), e.rank))) return {};
  const std::string who = e.rank < 0 ? rankList(suspects(c)) : "rank " + std::to_string(e.rank);
  return LinkReason{who + " computed from the copy of " + textOr(c, "tensor") + " that disagrees from step " +
                        std::to_string(c.step),
                    rowsOf(c, "alerts", 2)};
}

// `tpscope replay`'s verdict on a step is evidence about the NaN/Inf born at that step: the replay made it again
// (the operator named) or did not (suspect the hardware).
Reason replayOf(const Finding& c, const Finding& e) {
  if (!(origin(c) && isKind(e, FindingKind::Replay))) return {};
  if (e.step == c.step && textOr(e, "verdict") != "traced")
    return LinkReason{"the replay re-ran step " + std::to_string(e.step) + ": " + textOr(e, "verdict"),
                      rowsOf(e, "alerts", 1)};
  if (numberOr(e, "after_step", -1) == c.step)
    return LinkReason{"the op check armed after step " + std::to_string(c.step) + " named the operator of the next one",
                      rowsOf(e, "alerts", 1)};
  return {};
}

Reason stragglerCauses(const Ctx& x, const Finding& c, const Finding& e) {
  if (!(isKind(c, FindingKind::Straggler) && c.severity <= Severity::Warning && isKind(e, FindingKind::CommOverhead)))
    return {};
  if (e.rank >= 0 && !contains(c.ranks, e.rank)) return {};
  // The waiting it caused where it arrived last, in a group of r that holds the waiting rank (collectives.h): a group
  // where it caused no more than chance would is no link.
  const RankStraggling* rs = x.straggling(c.rank);
  if (rs == nullptr) return {};
  for (const GroupStraggling& g : rs->groups) {
    if (static_cast<double>(g.causedWaitNs) <= g.expectedWaitNs || g.lastCount == 0) continue;
    if (e.rank >= 0 && (e.rank == c.rank || !contains(x.members(g.group), e.rank))) continue;
    LinkReason r{(e.rank >= 0 ? "rank " + std::to_string(e.rank) : std::string("the ranks of " + g.group)) +
                     " waited on rank " + std::to_string(c.rank) + " in " + g.group + ": " +
                     text::ms(static_cast<double>(g.causedWaitNs)) + " ms in all where it arrived last",
                 {}};
    for (const auto& [seq, w] : g.worst)
      if (r.rows.size() < 4) r.rows.push_back(collectiveRow(c.rank, g.group, seq));
    return r;
  }
  return {};
}

// A rank's gradient spike and what its gradient feeds: the run-wide norm of that step (computed from it), the loss of
// that step (the same batch's forward) or of the next (the first after an update the spike moved: the run-wide norm
// must show it, anomalies.cpp's global_value), a divergence of values it is one of.
Reason spikeCauses(const Finding& c, const Finding& e) {
  if (!isKind(c, FindingKind::GradSpike) || c.rank < 0 || c.step < 0) return {};
  const std::vector<EvidenceRow> own = {
      {"step_stats", {field("rank", int64_t{c.rank}), field("step", int64_t{c.step})}}};
  const std::string r = "rank " + std::to_string(c.rank);
  if (isKind(e, FindingKind::GradSpike)) {
    if (!(e.rank < 0 && e.step == c.step)) return {};
    return LinkReason{"the run-wide norm of step " + std::to_string(c.step) + " is computed from " + r + "'s gradients",
                      own};
  }
  if (isKind(e, FindingKind::LossSpike)) {
    if (e.step == c.step)
      return LinkReason{"one batch: step " + std::to_string(c.step) + "'s loss is the forward whose backward gave " + r +
                            "'s spiked gradient",
                        own};
    const double global = numberAs<double>(c, "global_value", -1), median = numberAs<double>(c, "global_median", -1);
    if (e.step != c.step + 1 || global <= 0 || median <= 0) return {};
    return LinkReason{"the update of step " + std::to_string(c.step) + " used the spiked gradient (the run-wide norm " +
                          detail::threeDigits(global) + ", median " + detail::threeDigits(median) + "); step " +
                          std::to_string(e.step) + "'s loss is the first after it",
                      own};
  }
  if (isKind(e, FindingKind::ReplicaDivergence)) {
    if (e.step != c.step || !(e.rank == c.rank || contains(e.ranks, c.rank))) return {};
    return LinkReason{r + "'s value is one of those that disagree at step " + std::to_string(e.step), own};
  }
  return {};
}

// The rules in order of precedence: a finding takes the first cause that names it.
const std::vector<std::function<Reason(const Ctx&, const Finding&, const Finding&)>>& rules() {
  static const std::vector<std::function<Reason(const Ctx&, const Finding&, const Finding&)>> r = {
      [](const Ctx&, const Finding& c, const Finding& e) { return explainedBy(c, e); },
      desyncCauses,
      [](const Ctx&, const Finding& c, const Finding& e) { return crashCauses(c, e); },
      hangCauses,
      sdcCauses,
      originCauses,
      stragglerCauses,
      [](const Ctx&, const Finding& c, const Finding& e) { return spikeCauses(c, e); },
      [](const Ctx&, const Finding& c, const Finding& e) { return replayOf(c, e); },
  };
  return r;
}

// parent[i]: the finding that caused finding i, −1 for a root, with the connection in because[i]. Never a cycle.
struct Causes {
  std::vector<int> parent;
  std::vector<std::optional<LinkReason>> because;
};

Causes causes(const Ctx& x) {
  const int n = static_cast<int>(x.all.size());
  Causes out{std::vector<int>(n, -1), std::vector<std::optional<LinkReason>>(n)};
  auto reaches = [&](int from, int to) {  // does following parents from `from` reach `to`?
    for (int p = from; p >= 0; p = out.parent[p])
      if (p == to) return true;
    return false;
  };
  for (const auto& rule : rules())
    for (int e = 0; e < n; ++e) {
      if (out.parent[e] >= 0) continue;
      for (int c = 0; c < n; ++c) {
        if (c == e || reaches(c, e)) continue;
        if (Reason why = rule(x, x.all[c], x.all[e])) {
          out.parent[e] = c;
          out.because[e] = std::move(why);
          break;
        }
      }
    }
  return out;
}

// ---- Links ----

ChainLink fromFinding(const Finding& fd, int index) {
  ChainLink l;
  l.kind = std::string(findingKindName(fd.kind));
  l.severity = fd.severity;
  l.rank = fd.rank;
  l.step = fd.step;
  l.layer = fd.layer;
  l.collective = fd.collective;
  l.message = fd.message;
  l.evidence = fd.evidence;
  l.finding = index;
  return l;
}

ChainLink derived(std::string kind, Severity sev) {
  ChainLink l;
  l.kind = std::move(kind);
  l.severity = sev;
  return l;
}

// The waiting rank `r` caused in group `g` (the others' waiting where it was last), per waiting member and step
// (ns); 0 when it caused no more than chance would have put on it (its lateness there is not systematic).
double groupLagPerStep(const Ctx& x, const GroupStraggling& g) {
  if (static_cast<double>(g.causedWaitNs) <= g.expectedWaitNs) return 0;
  const size_t n = std::max<size_t>(2, x.members(g.group).size());
  return static_cast<double>(g.causedWaitNs) / static_cast<double>(n - 1) / static_cast<double>(x.steps());
}

// A derived link is as severe as the finding it derives from: an info straggler's waiting is a figure, not a fault.
ChainLink groupWait(const Ctx& x, Severity sev, int late, const GroupStraggling& g, double lagPerStep,
                    const std::string& via) {
  ChainLink l = derived("group_wait", sev);
  l.rank = late;
  std::vector<int> waiters;
  for (int m : x.members(g.group))
    if (m != late) waiters.push_back(m);
  const std::string op = [&] {
    if (x.in.collectives != nullptr && !g.worst.empty())
      for (const auto& a : x.in.collectives->worst)
        if (a.group == g.group && a.seq == g.worst.front().first) return a.op;
    return std::string();
  }();
  if (!g.worst.empty()) l.collective = CollectiveRef{g.group, g.worst.front().first, op};
  l.message = g.group + ": " + rankList(waiters) + " wait " + text::ms(lagPerStep) + " ms per step on rank " +
              std::to_string(late) + via + " (last at " + std::to_string(g.lastCount) + " of " +
              std::to_string(g.collectives) + " collectives";
  if (!g.worst.empty()) {
    l.message += "; worst seq";
    for (size_t i = 0; i < g.worst.size(); ++i) l.message += (i ? ", " : " ") + std::to_string(g.worst[i].first);
  }
  l.message += ")";
  l.costNs = static_cast<int64_t>(lagPerStep * static_cast<double>(x.steps()));
  for (const auto& [seq, w] : g.worst)
    l.evidence.rows.push_back(
        {"collectives", {field("rank", int64_t{late}), field("group_name", g.group), field("seq", seq)}});
  l.evidence.numbers = {field("caused_wait_ns", g.causedWaitNs), field("expected_wait_ns", g.expectedWaitNs),
                        field("last_count", g.lastCount), field("collectives", g.collectives),
                        field("wait_per_member_per_step_ns", lagPerStep), field("steps", x.steps())};
  return l;
}

// A straggler's consequences: the waiting in each of its groups (and, one hop on, the groups its waiters then hold
// up), and what that waiting does to the step time. Returns the lag per step (the worst group's).
double stragglerLinks(const Ctx& x, const Finding& fd, ChainLink& root) {
  const RankStraggling* rs = x.straggling(fd.rank);
  if (rs == nullptr) return 0;
  const double stepNs = x.meanStepNs();
  const double floorNs = 0.01 * stepNs;  // a lag under 1 % of a step is noise, not a link
  double lag = 0;
  std::vector<std::string> own;
  for (const GroupStraggling& g : rs->groups) own.push_back(g.group);
  for (const GroupStraggling& g : rs->groups) {
    const double perStep = groupLagPerStep(x, g);
    if (perStep <= floorNs || g.lastCount == 0) continue;
    lag = std::max(lag, perStep);
    ChainLink gl = groupWait(x, fd.severity, fd.rank, g, perStep, "");
    // Its waiters arrive late at their next collective in their other groups.
    for (int v : x.members(g.group)) {
      if (v == fd.rank) continue;
      const RankStraggling* vs = x.straggling(v);
      if (vs == nullptr) continue;
      for (const GroupStraggling& h : vs->groups) {
        if (std::find(own.begin(), own.end(), h.group) != own.end()) continue;
        const double vPerStep = groupLagPerStep(x, h);
        if (vPerStep <= floorNs || h.lastCount == 0) continue;
        gl.consequences.push_back(groupWait(x, fd.severity, v, h, vPerStep,
                                            " (held up by rank " + std::to_string(fd.rank) + " in " + g.group + ")"));
      }
    }
    root.consequences.push_back(std::move(gl));
  }
  if (lag > 0 && stepNs > lag) {
    ChainLink st = derived("step_time", fd.severity);
    const double pct = 100.0 * lag / (stepNs - lag);
    st.message = "step time +" + text::pct(pct) + ": " + text::ms(lag) + " ms of a mean " + text::ms(stepNs) +
                 " ms step is waiting on rank " + std::to_string(fd.rank);
    st.costNs = static_cast<int64_t>(lag * static_cast<double>(x.steps()));
    st.evidence.rows.push_back({"spans", {field("rank", int64_t{fd.rank})}});
    st.evidence.numbers = {field("mean_step_ns", stepNs), field("wait_per_step_ns", lag), field("step_time_pct", pct),
                           field("steps", x.steps())};
    root.consequences.push_back(std::move(st));
  }
  return lag;
}

// A non-finite origin's hops, nested: a hop from a rank another hop reached hangs under that hop.
void spreadLinks(const Ctx& x, const Finding& fd, ChainLink& root) {
  const NonFiniteReport* nf = incidentAt(x.in.nonfinite, fd.rank, fd.step);
  if (nf == nullptr) return;
  auto firstEvent = [&](int rank) -> const NonFiniteEvent* {
    for (const auto& e : nf->firstPerRank)
      if (e.rank == rank) return &e;
    return nullptr;
  };
  // Build each hop's link, then attach it to the latest earlier hop that reached its sender (else the root).
  std::vector<ChainLink> hops;
  std::vector<int> parent;
  for (size_t i = 0; i < nf->spread.size(); ++i) {
    const SpreadHop& h = nf->spread[i];
    ChainLink l = derived("spread", fd.severity);
    l.rank = h.fromRank;
    l.step = h.step;
    l.collective = h.collective;
    l.message = "carried by " + (h.collective.op.empty() ? std::string("collective") : h.collective.op) + " " +
                h.collective.group + " seq " + std::to_string(h.collective.seq) + " (step " + std::to_string(h.step) +
                ") from rank " + std::to_string(h.fromRank) + " → " + rankList(h.toRanks);
    l.evidence.rows.push_back({"collectives",
                               {field("rank", int64_t{h.fromRank}), field("group_name", h.collective.group),
                                field("seq", h.collective.seq)}});
    std::vector<std::string> shows;
    for (int r : h.toRanks)
      if (const NonFiniteEvent* e = firstEvent(r)) {
        shows.push_back("rank " + std::to_string(r) + ": " + e->param + (e->phase.empty() ? "" : " " + e->phase) +
                        " at step " + std::to_string(e->step));
        if (e->source == "step_stats")
          l.evidence.rows.push_back({"step_stats", {field("rank", int64_t{r}), field("step", int64_t{e->step})}});
        else if (e->source == "grad_stats")
          l.evidence.rows.push_back(
              {"grad_stats", {field("rank", int64_t{r}), field("step", int64_t{e->step}), field("param", e->param)}});
        else if (e->tsNs)
          l.evidence.rows.push_back(
              {"alerts", {field("rank", int64_t{r}), field("step", int64_t{e->step}), field("ts_ns", *e->tsNs)}});
      }
    if (!shows.empty()) {
      l.message += " (";
      for (size_t k = 0; k < shows.size(); ++k) l.message += (k ? "; " : "") + shows[k];
      l.message += ")";
    }
    l.evidence.numbers.push_back(field("receivers", static_cast<int64_t>(h.toRanks.size())));
    int p = -1;
    for (int j = static_cast<int>(i) - 1; j >= 0 && p < 0; --j)
      if (contains(nf->spread[j].toRanks, h.fromRank)) p = j;
    hops.push_back(std::move(l));
    parent.push_back(p);
  }
  // Attach children before parents (a hop's parent comes earlier): walk backwards.
  for (int i = static_cast<int>(hops.size()) - 1; i >= 0; --i)
    if (parent[i] >= 0) hops[parent[i]].consequences.insert(hops[parent[i]].consequences.begin(), std::move(hops[i]));
  for (size_t i = 0; i < hops.size(); ++i)
    if (parent[i] < 0) root.consequences.push_back(std::move(hops[i]));
}

// The link of finding `i` with its derived links and the findings it caused, recursively.
ChainLink build(const Ctx& x, int i, const Causes& cs, const std::vector<std::vector<int>>& children) {
  const Finding& fd = x.all[i];
  ChainLink l = fromFinding(fd, i);
  l.because = cs.because[i];
  switch (fd.kind) {
    case FindingKind::Straggler: {
      const double lag = stragglerLinks(x, fd, l);
      if (lag > 0) {
        l.costNs = static_cast<int64_t>(lag * static_cast<double>(x.steps()));
        l.evidence.numbers.push_back(field("cost_per_step_ns", lag));
      }
      break;
    }
    case FindingKind::NanOrigin:
    case FindingKind::InfOrigin:
      if (fd.severity == Severity::Critical) {
        spreadLinks(x, fd, l);
        // To the run's end, or to the step before a clean one where a later incident follows (nonfinite.h).
        const int64_t last = std::min<int64_t>(x.lastStep(), numberOr(fd, "incident_last_step", INT64_MAX));
        if (fd.step >= 0 && last >= fd.step) l.costSteps = last - fd.step + 1;
      }
      break;
    case FindingKind::Hang:
    case FindingKind::PipelineHang: l.costNs = x.hangWaitNs(fd); break;
    case FindingKind::Crash: {
      const int last = x.lastStep();
      if (fd.step >= 0 && last > fd.step) l.costSteps = last - fd.step;
      break;
    }
    default: break;
  }
  for (int c : children[i]) {
    ChainLink child = build(x, c, cs, children);
    // A cause costs at least what its consequences cost (a crash costs the hang it caused).
    if (child.costNs > l.costNs && (fd.kind == FindingKind::Crash || fd.kind == FindingKind::Desync || stuck(fd)))
      l.costNs = child.costNs;
    l.consequences.push_back(std::move(child));
  }
  return l;
}

Severity worst(const ChainLink& l) {
  Severity s = l.severity;
  for (const auto& c : l.consequences) s = std::min(s, worst(c));
  return s;
}

void collect(const ChainLink& l, std::vector<int>& out) {
  if (l.finding >= 0) out.push_back(l.finding);
  for (const auto& c : l.consequences) collect(c, out);
}

}  // namespace

std::vector<ChainLink> buildChain(const std::vector<Finding>& findings, const ChainInputs& inputs) {
  const Ctx x{findings, inputs};
  const Causes cs = causes(x);
  std::vector<std::vector<int>> children(findings.size());
  for (size_t e = 0; e < findings.size(); ++e)
    if (cs.parent[e] >= 0) children[cs.parent[e]].push_back(static_cast<int>(e));
  std::vector<ChainLink> roots;
  for (size_t i = 0; i < findings.size(); ++i) {
    if (cs.parent[i] >= 0) continue;
    ChainLink root = build(x, static_cast<int>(i), cs, children);
    if (worst(root) <= Severity::Warning) roots.push_back(std::move(root));
  }
  // Most severe tree first; ties keep the findings' order (most severe root first).
  std::stable_sort(roots.begin(), roots.end(), [](const ChainLink& a, const ChainLink& b) { return worst(a) < worst(b); });
  return roots;
}

std::vector<int> chainFindings(const std::vector<ChainLink>& chain) {
  std::vector<int> out;
  for (const auto& l : chain) collect(l, out);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tpscope::analysis
