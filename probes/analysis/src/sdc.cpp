#include "tpscope/analysis/sdc.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tpscope/probes/alert_kinds.h"
#include "evidence_util.h"

namespace tpscope::analysis {

namespace {

using detail::f;

std::string rankList(const std::vector<int>& ranks) {
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
    if (a.kind == probes::alert_kinds::kSilentCorruption) incidents[{a.step, a.param}].push_back(&a);
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
      fd.message = "silent data corruption: " + rankList(fd.ranks) + "'s copy of " + where + " differs from the " +
                   std::to_string(copies - static_cast<int64_t>(fd.ranks.size())) + " other copies " + when;
    else
      fd.message = "silent data corruption: " + rankList(fd.ranks) + " disagree on " + where + " " + when +
                   "; no majority among " + std::to_string(copies) + " copies, each is a suspect";
    fd.details.push_back(std::string(replicated ? "replicated on every rank (TP and DP)" : "a DP replica of one TP "
                                                                                          "shard") +
                         "; found by the fingerprint check of step " + std::to_string(checkStep));
    if (num("tensors_disagreeing", 1) > 1)
      fd.details.push_back(std::to_string(num("tensors_disagreeing", 1)) + " tensors disagree at that step");
    for (const auto* a : rows) fd.cite("alerts", {f("rank", int64_t{a->rank}), f("step", int64_t{a->step}), f("ts_ns", a->tsNs)});
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

}  // namespace tpscope::analysis
