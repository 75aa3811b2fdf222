#include "tpscope/analysis/sdc.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tpscope/vocabulary/alert_kinds.h"
#include "evidence_util.h"

namespace tpscope::analysis {

namespace {

using detail::field;

// Without a majority and without another fault that parted the copies (explainDivergences), what would decide.
constexpr const char* kUndecided =
    "nothing else tells the copies apart: a replay from the last checkpoint (--resume; the steps are deterministic, so "
    "the replayed copy shows which one moved) or a third copy of this tensor (a layout with more replicas of it) would "
    "decide";

std::string suspectList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i == 0 ? "" : (i + 1 == ranks.size() ? " and " : ", ")) + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

}  // namespace

tracedb::Result<std::vector<Finding>> silentCorruptionFindings(tracedb::Reader& reader) {
  auto alerts = reader.alerts();
  if (!alerts) return alerts.status();
  // (first step, tensor) -> the alerts of that incident (one per suspect rank).
  std::map<std::tuple<int, std::string>, std::vector<const tracedb::AlertRow*>> incidents;
  for (const auto& a : *alerts)
    if (a.kind == vocabulary::alert_kinds::kSilentCorruption) incidents[{a.step, a.param}].push_back(&a);
  std::vector<Finding> out;
  for (const auto& [key, rows] : incidents) {
    const auto& [step, tensor] = key;
    const auto ev = nlohmann::json::parse(rows.front()->evidence, nullptr, false);
    auto num = [&](const char* name, int64_t fallback) {
      return ev.is_object() && ev.contains(name) && ev[name].is_number_integer() ? ev[name].get<int64_t>() : fallback;
    };
    std::set<int> suspects;
    for (const auto* a : rows) suspects.insert(a->rank);
    if (ev.is_object() && ev.contains("suspects") && ev["suspects"].is_array())
      for (const auto& s : ev["suspects"])
        if (s.is_number_integer()) suspects.insert(s.get<int>());
    const bool majority = ev.is_object() && ev.value("majority", false);
    const bool replicated = ev.is_object() && ev.value("replicated", false);
    const int64_t checkStep = num("check_step", step), earliest = num("earliest_step", step);
    const int64_t copies = num("copies", 0);
    Finding fd;
    fd.kind = FindingKind::SilentCorruption;
    fd.severity = Severity::Critical;
    fd.step = step;
    fd.layer = rows.front()->layer;
    fd.ranks.assign(suspects.begin(), suspects.end());
    fd.rank = majority && fd.ranks.size() == 1 ? fd.ranks.front() : -1;
    const std::string where = fd.layer >= 0 ? tensor + " (layer " + std::to_string(fd.layer) + ")" : tensor;
    const std::string when = earliest == step ? "from step " + std::to_string(step)
                                              : "between steps " + std::to_string(earliest) + " and " +
                                                    std::to_string(step);
    if (majority)
      fd.message = "silent data corruption: " + suspectList(fd.ranks) + "'s copy of " + where + " differs from the " +
                   std::to_string(copies - static_cast<int64_t>(fd.ranks.size())) + " other copies " + when;
    else
      fd.message = "silent data corruption: " + suspectList(fd.ranks) + " disagree on " + where + " " + when +
                   "; no majority among " + std::to_string(copies) + " copies, each is a suspect";
    if (!majority)
      fd.details.push_back(kUndecided);
    fd.details.push_back(std::string(replicated ? "replicated on every rank (TP and DP)" : "a DP replica of one TP "
                                                                                          "shard") +
                         "; found by the fingerprint check of step " + std::to_string(checkStep));
    if (num("tensors_disagreeing", 1) > 1)
      fd.details.push_back(std::to_string(num("tensors_disagreeing", 1)) + " tensors disagree at that step");
    for (const auto* a : rows)
      fd.cite("alerts", {field("rank", int64_t{a->rank}), field("step", int64_t{a->step}), field("ts_ns", a->tsNs)});
    fd.number("tensor", tensor)
        .number("check_step", checkStep)
        .number("earliest_step", earliest)
        .number("copies", copies)
        .number("majority", int64_t{majority ? 1 : 0})
        .number("tensors_disagreeing", num("tensors_disagreeing", 1));
    out.push_back(std::move(fd));
  }
  return out;
}

namespace {

const EvidenceField* numberNamed(const Finding& fd, const char* name) {
  for (const auto& n : fd.evidence.numbers)
    if (n.name == name) return &n;
  return nullptr;
}

std::string textNumber(const Finding& fd, const char* name) {
  const EvidenceField* n = numberNamed(fd, name);
  const auto* s = n != nullptr ? std::get_if<std::string>(&n->value) : nullptr;
  return s != nullptr ? *s : std::string();
}

void setNumber(Finding& fd, const char* name, EvidenceValue v) {
  for (auto& n : fd.evidence.numbers)
    if (n.name == name) {
      n.value = std::move(v);
      return;
    }
  fd.number(name, std::move(v));
}

bool holds(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The fault found to part the copies, told on the finding: a consequence (error, secondary), its cause named.
void markConsequence(Finding& fd, const Finding& cause, std::string message, std::vector<std::string> why) {
  why.push_back("the replica check: " + fd.message);
  for (auto& d : fd.details)
    if (d != kUndecided) why.push_back(std::move(d));
  fd.details = std::move(why);
  fd.message = std::move(message);
  fd.severity = Severity::Error;
  setNumber(fd, "secondary", int64_t{1});
  setNumber(fd, "cause", std::string(findingKindName(cause.kind)));
  setNumber(fd, "cause_rank", int64_t{cause.rank});
  setNumber(fd, "cause_step", int64_t{cause.step});
}

std::string tensorOf(const Finding& fd) {
  std::string t = textNumber(fd, "tensor");
  return fd.layer >= 0 ? t + " (layer " + std::to_string(fd.layer) + ")" : t;
}

// Rule 1: copies computed from non-finite values. The suspects that held a non-finite value by the step the copies
// part, each with its first record.
bool explainByNonFinite(Finding& fd, const std::vector<Finding>& all, const NonFiniteReport* nf) {
  const int S = fd.step;
  for (const Finding& o : all) {
    if ((o.kind != FindingKind::NanOrigin && o.kind != FindingKind::InfOrigin) || o.step < S - 1 || o.step > S)
      continue;
    const NonFiniteReport* incident = incidentAt(nf, o.rank, o.step);  // null: a rank it does not explain
    const bool mainOrigin = incident != nullptr;
    std::vector<const NonFiniteEvent*> held;
    std::vector<int> heldRanks;
    for (int u : fd.ranks) {
      const NonFiniteEvent* e = nullptr;
      if (mainOrigin)
        for (const auto& ev : incident->firstPerRank)
          if (ev.rank == u && ev.step <= S) e = &ev;
      if (e == nullptr && mainOrigin && incident->origin->rank == u) e = &*incident->origin;
      if (e != nullptr || u == o.rank) {
        held.push_back(e);
        heldRanks.push_back(u);
      }
    }
    if (heldRanks.empty() || !(mainOrigin || holds(heldRanks, o.rank))) continue;
    const std::string value = o.kind == FindingKind::NanOrigin ? "NaN" : "Inf";
    std::vector<std::string> why;
    for (size_t i = 0; i < heldRanks.size(); ++i) {
      const NonFiniteEvent* e = held[i];
      if (e == nullptr) continue;
      why.push_back("rank " + std::to_string(e->rank) + " held non-finite values by then: " + e->param +
                    (e->source == "grad_stats" ? " grad" : "") + " at step " + std::to_string(e->step) + " (" +
                    e->source + ")");
      if (e->source == "grad_stats")
        fd.cite("grad_stats", {detail::field("rank", int64_t{e->rank}), detail::field("step", int64_t{e->step}),
                               detail::field("param", e->param)});
      else if (e->source == "step_stats")
        fd.cite("step_stats", {detail::field("rank", int64_t{e->rank}), detail::field("step", int64_t{e->step})});
      else if (e->tsNs)
        fd.cite("alerts", {detail::field("rank", int64_t{e->rank}), detail::field("step", int64_t{e->step}),
                           detail::field("ts_ns", *e->tsNs)});
    }
    fd.rank = holds(heldRanks, o.rank) ? o.rank : heldRanks.front();
    fd.ranks = heldRanks;
    markConsequence(fd, o,
                    "the copies of " + tensorOf(fd) + " part from step " + std::to_string(S) + " because " +
                        suspectList(heldRanks) + (heldRanks.size() == 1 ? " holds" : " hold") +
                        " values computed from non-finite gradients: a consequence of the " + value + " on rank " +
                        std::to_string(o.rank) + " at step " + std::to_string(o.step) + ", not a corruption",
                    std::move(why));
    return true;
  }
  return false;
}

// Rule 2: exactly one suspect's gradient stood out at the step the copies part or the one before. Returns the index
// of the grad_spike finding that explains it (appended to `all` from a rank jump where none named it), or −1.
int explainBySpike(size_t at, std::vector<Finding>& all, const AnomalyReport* anomalies, const AnomalyOptions& options) {
  const Finding& fd = all[at];
  const int S = fd.step;
  std::map<int, int> spikeOf;          // suspect → a grad_spike finding on it
  std::map<int, const RankJump*> jumpOf;  // suspect → its rank jump
  for (size_t i = 0; i < all.size(); ++i) {
    const Finding& g = all[i];
    if (g.kind == FindingKind::GradSpike && g.rank >= 0 && g.step >= S - 1 && g.step <= S && holds(fd.ranks, g.rank))
      spikeOf.try_emplace(g.rank, static_cast<int>(i));
  }
  if (anomalies != nullptr)
    for (const RankJump& j : anomalies->rankJumps)
      if (j.step >= S - 1 && j.step <= S && holds(fd.ranks, j.rank)) jumpOf.try_emplace(j.rank, &j);
  std::vector<int> standOut;
  for (int u : fd.ranks)
    if (spikeOf.count(u) || jumpOf.count(u)) standOut.push_back(u);
  if (standOut.size() != 1) return -1;
  const int j = standOut.front();
  int cause = -1;
  if (auto it = spikeOf.find(j); it != spikeOf.end()) {
    cause = it->second;
  } else {
    all.push_back(rankJumpFinding(*jumpOf.at(j), options));
    cause = static_cast<int>(all.size()) - 1;
  }
  Finding& spike = all[static_cast<size_t>(cause)];
  if (spike.severity > Severity::Warning) spike.severity = Severity::Warning;  // it moved state: not a figure
  Finding& d = all[at];
  std::vector<std::string> why;
  std::string figure;
  if (auto it = jumpOf.find(j); it != jumpOf.end()) {
    const RankJump& r = *it->second;
    figure = " (its total norm " + detail::threeDigits(r.norm) + ", " + detail::threeDigits(r.norm / r.median) +
             "× its median " + detail::threeDigits(r.median) + "; no other rank's moved " +
             detail::threeDigits(options.normRatioThreshold) + "×)";
  }
  why.push_back("rank " + std::to_string(j) + "'s gradient stood out at step " + std::to_string(spike.step) + figure +
                ": " + spike.message);
  for (const auto& row : spike.evidence.rows)
    if (row.table == "grad_stats") d.cite(row.table, row.key);
  d.rank = j;
  d.ranks = {j};
  markConsequence(d, spike,
                  "rank " + std::to_string(j) + "'s copy of " + tensorOf(d) + " parts from the others from step " +
                      std::to_string(S) + ": its gradient stood out at step " + std::to_string(spike.step) +
                      figure + " — a consequence of that gradient spike, not a corruption",
                  std::move(why));
  return cause;
}

// Rule 3: a real corruption with two or more suspects and no majority, after which (within two steps) the run's first
// non-finite value was born on one suspect's rank, computing from its own copy, and reached every other suspect only
// through collectives. That rank's copy is the one that moved: the others computed nothing wrong from theirs. The
// finding stays a corruption, narrowed to that rank, with the evidence.
bool narrowByOrigin(Finding& fd, const NonFiniteReport* nf) {
  if (nf == nullptr || !nf->origin || fd.ranks.size() < 2) return false;
  const NonFiniteEvent& o = *nf->origin;
  // Within two steps of the parting: a flipped bit that makes a value non-finite does so at the next forward pass; a
  // NaN much later may have another cause, and then the copies stay undecided.
  if (o.step <= fd.step || o.step > fd.step + 2 || !holds(fd.ranks, o.rank) || !nf->unexplained.empty()) return false;
  for (int u : fd.ranks)
    if (u != o.rank && !holds(nf->receivers, u)) return false;
  std::vector<int> others;
  for (int u : fd.ranks)
    if (u != o.rank) others.push_back(u);
  const std::string value = o.isNan() ? "NaN" : "Inf";  // as the origin's finding names it
  std::erase(fd.details, std::string(kUndecided));  // decided
  fd.details.insert(fd.details.begin(), "rank " + std::to_string(o.rank) +
                                            "'s copy is the one that moved: the first non-finite value after the "
                                            "copies parted was born on rank " +
                                            std::to_string(o.rank) + " at step " + std::to_string(o.step) + " (" +
                                            o.param + "), and " + suspectList(others) +
                                            " only received it through collectives");
  if (o.tsNs)
    fd.cite("alerts", {detail::field("rank", int64_t{o.rank}), detail::field("step", int64_t{o.step}),
                       detail::field("ts_ns", *o.tsNs)});
  fd.message = "silent data corruption: rank " + std::to_string(o.rank) + "'s copy of " + tensorOf(fd) +
               " moved from step " + std::to_string(fd.step) + " — the " + value + " born on it at step " +
               std::to_string(o.step) + " says which of the " + std::to_string(fd.ranks.size()) +
               " disagreeing copies it is";
  fd.rank = o.rank;
  fd.ranks = {o.rank};
  setNumber(fd, "suspect_by", std::string("nonfinite_origin"));
  return true;
}

}  // namespace

void explainDivergences(std::vector<Finding>& findings, const NonFiniteReport* nonfinite, const AnomalyReport* anomalies,
                        const AnomalyOptions& options) {
  const size_t n = findings.size();
  for (size_t i = 0; i < n; ++i) {
    if (findings[i].kind != FindingKind::SilentCorruption || findings[i].step < 0) continue;
    if (explainByNonFinite(findings[i], findings, nonfinite)) continue;
    if (explainBySpike(i, findings, anomalies, options) >= 0) continue;
    narrowByOrigin(findings[i], nonfinite);
  }
}

}  // namespace tpscope::analysis
