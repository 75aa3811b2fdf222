#include "tpscope/analysis/replay.h"

#include <map>
#include <nlohmann/json.hpp>

#include "evidence_util.h"
#include "tpscope/vocabulary/alert_kinds.h"

namespace tpscope::analysis {

namespace {

// The operator an op check named (its evidence object: the alert's, or the `op` of a replay verdict) as numbers.
void numberOperator(Finding& fd, const nlohmann::json& op) {
  fd.number("op", op.value("op", ""))
      .number("pass", op.value("pass", ""))
      .number("span", op.value("span", ""))
      .number("produced", int64_t{op.value("produced", false) ? 1 : 0})
      .number("ops_checked", op.value("ops_checked", int64_t{0}));
}

}  // namespace

tracedb::Result<std::vector<Finding>> replayFindings(tracedb::Reader& reader) {
  auto alerts = reader.alerts();
  if (!alerts) return alerts.status();
  std::map<int, const tracedb::AlertRow*> latest;  // step -> the latest verdict (alerts come by time)
  std::vector<Finding> out;
  for (const auto& a : *alerts) {
    if (a.kind == vocabulary::alert_kinds::kReplay) latest[a.step] = &a;
    if (a.kind != vocabulary::alert_kinds::kOpCheck) continue;
    // The op check armed live (--on-nonfinite trace-ops): the operator of the next occurrence, as the replay names it.
    const auto ev = nlohmann::json::parse(a.evidence, nullptr, false);
    if (!ev.is_object() || !ev.value("live", false)) continue;
    Finding fd;
    fd.kind = FindingKind::Replay;
    fd.severity = Severity::Info;
    fd.rank = a.rank;
    fd.step = a.step;
    fd.layer = a.layer;
    const int after = ev.value("after_step", -1);
    fd.message = "traced live after the non-finite value of step " + std::to_string(after) + ": " + a.message;
    fd.cite("alerts", {detail::field("rank", int64_t{a.rank}), detail::field("step", int64_t{a.step}),
                       detail::field("kind", std::string(vocabulary::alert_kinds::kOpCheck))});
    fd.number("verdict", std::string("traced")).number("after_step", int64_t{after});
    numberOperator(fd, ev);
    out.push_back(std::move(fd));
  }
  for (const auto& [step, a] : latest) {
    const auto ev = nlohmann::json::parse(a->evidence, nullptr, false);
    const nlohmann::json op =
        ev.is_object() && ev.contains("op") && ev["op"].is_object() ? ev["op"] : nlohmann::json::object();
    const std::string verdict = ev.is_object() ? ev.value("verdict", "") : "";
    Finding fd;
    fd.kind = FindingKind::Replay;
    fd.severity = verdict == "transient" ? Severity::Warning : Severity::Info;
    fd.rank = a->rank;
    fd.step = step;
    fd.layer = a->layer;
    fd.message = a->message;
    if (op.contains("inputs") && op["inputs"].is_array())
      for (const auto& in : op["inputs"])
        if (in.is_object() && !in.value("finite", true))
          fd.details.push_back("input " + std::to_string(in.value("index", 0)) + " (" + in.value("kind", "") + " " +
                               in.value("dtype", "") +
                               (in.value("param", "").empty() ? "" : ", " + in.value("param", "")) + ") is not finite");
    if (ev.is_object() && ev.contains("batch") && ev["batch"].is_string())
      fd.details.push_back("batch: " + ev["batch"].get<std::string>());
    if (ev.is_object() && ev.contains("replay_run") && ev["replay_run"].is_string())
      fd.details.push_back("the replay's run: " + ev["replay_run"].get<std::string>());
    fd.cite("alerts", {detail::field("rank", int64_t{a->rank}), detail::field("step", int64_t{step}),
                       detail::field("kind", std::string(vocabulary::alert_kinds::kReplay))});
    fd.number("verdict", verdict);
    if (!op.empty()) numberOperator(fd, op);
    out.push_back(std::move(fd));
  }
  return out;
}

}  // namespace tpscope::analysis
