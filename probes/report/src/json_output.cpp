#include "tpscope/report/json_output.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tpscope::report {

using namespace tpscope::analysis;

namespace {

using Json = nlohmann::ordered_json;

// Reals with 6 significant digits (stable golden output); non-finite values become null.
Json real(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

Json value(const EvidenceValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return real(*d);
  return std::get<std::string>(v);
}

Json fields(const std::vector<EvidenceField>& fs) {
  Json o = Json::object();
  for (const auto& f : fs) o[f.name] = value(f.value);
  return o;
}

Json rowsJson(const std::vector<EvidenceRow>& rows) {
  Json out = Json::array();
  for (const auto& r : rows) out.push_back(Json{{"table", r.table}, {"key", fields(r.key)}});
  return out;
}

Json evidenceJson(const Evidence& e) {
  return Json{{"rows", rowsJson(e.rows)}, {"rows_omitted", e.rowsOmitted}, {"numbers", fields(e.numbers)}};
}

Json collectiveJson(const std::optional<CollectiveRef>& c) {
  if (!c) return nullptr;
  return Json{{"group", c->group}, {"seq", c->seq}, {"op", c->op}};
}

// What and where, the leading fields of a finding and of a chain link.
Json place(std::string kind, Severity severity, int rank, int step, int layer,
           const std::optional<CollectiveRef>& collective) {
  Json j;
  j["kind"] = std::move(kind);
  j["severity"] = std::string(severityName(severity));
  j["rank"] = rank;
  j["step"] = step;
  j["layer"] = layer;
  j["collective"] = collectiveJson(collective);
  return j;
}

// One link of the root-cause chain and its consequences (docs/diagnosis.md, "Root-cause chain").
Json chainJson(const ChainLink& l) {
  Json j = place(l.kind, l.severity, l.rank, l.step, l.layer, l.collective);
  j["message"] = l.message;
  j["cost_ns"] = l.costNs;
  j["cost_steps"] = l.costSteps;
  j["finding"] = l.finding;
  j["evidence"] = evidenceJson(l.evidence);
  j["because"] = l.because ? Json{{"text", l.because->text}, {"rows", rowsJson(l.because->rows)}} : Json(nullptr);
  Json cs = Json::array();
  for (const auto& c : l.consequences) cs.push_back(chainJson(c));
  j["consequences"] = std::move(cs);
  return j;
}

Json findingJson(const Finding& f) {
  Json j = place(std::string(findingKindName(f.kind)), f.severity, f.rank, f.step, f.layer, f.collective);
  j["ranks"] = f.ranks;
  j["message"] = f.message;
  j["details"] = f.details;
  j["evidence"] = evidenceJson(f.evidence);
  return j;
}

Json shares(const TimeShares& t) {
  Json j;
  j["step_ns"] = t.stepNs;
  j["compute_ns"] = t.computeNs;
  j["comm_ns"] = t.commNs;
  j["exposed_comm_ns"] = t.exposedCommNs;
  j["other_ns"] = t.otherNs;
  j["idle_ns"] = t.idleNs;
  j["memcpy_ns"] = t.memcpyNs;
  j["idle_host_wait_ns"] = t.idleHostWaitNs;
  j["idle_kernel_wait_ns"] = t.idleKernelWaitNs;
  j["idle_other_ns"] = t.idleOtherNs;
  j["comm_overhead_pct"] = real(t.commOverheadPct());
  return j;
}

Json record(const MemberRecord& r) {
  Json j;
  j["rank"] = r.rank;
  j["op"] = r.op;
  j["dtype"] = r.dtype;
  j["shape"] = r.shape;
  j["numel"] = r.numel;
  j["bytes"] = r.bytes;
  j["state"] = r.state;
  j["callsite"] = r.callsite;
  j["step"] = r.step;
  j["layer"] = r.layer;
  return j;
}

}  // namespace

std::string diagnosisToJson(const DiagnoseResult& result, const std::string& file, int indent) {
  Json j;
  j["version"] = kDiagnosisJsonVersion;
  j["file"] = file;
  Json chain = Json::array();
  for (const auto& l : result.chain) chain.push_back(chainJson(l));
  j["chain"] = std::move(chain);
  Json list = Json::array();
  for (const auto& f : result.findings) list.push_back(findingJson(f));
  j["findings"] = std::move(list);
  j["errors"] = result.errors;
  Json omitted = Json::object();
  for (const auto& [k, n] : result.omitted) omitted[k] = n;
  j["omitted"] = std::move(omitted);
  return j.dump(indent) + "\n";
}

namespace {
// report --json "pipeline" (docs/diagnosis.md).
Json pipelineJson(const PipelineReport& p) {
  Json j;
  j["schedule"] = p.schedule;
  j["stages"] = p.stages;
  j["microbatches"] = p.microbatches;
  j["virtual_stages"] = p.virtualStages;
  j["analytic_bubble_pct"] = real(p.analyticBubblePct);
  j["steps"] = p.steps;
  Json stages = Json::array();
  for (const auto& s : p.perStage) {
    Json x;
    x["stage"] = s.stage;
    x["ranks"] = s.ranks;
    x["step_ns"] = real(s.stepNs);
    x["compute_ns"] = real(s.computeNs);
    x["own_compute_ns"] = real(s.ownComputeNs);
    x["bubble_pct"] = real(s.bubblePct);
    x["warmup_cooldown_pct"] = real(s.warmupCooldownPct);
    x["dependency_wait_pct"] = real(s.dependencyWaitPct);
    x["transfer_pct"] = real(s.transferPct);
    stages.push_back(std::move(x));
  }
  j["per_stage"] = std::move(stages);
  j["longest_stage"] = p.longestStage;
  j["longest_over_mean_pct"] = real(p.longestOverMeanPct);
  return j;
}

// report --json "kernels" (docs/diagnosis.md): runs with device lanes only.
Json kernelsJson(const KernelSummary& k) {
  Json j;
  j["count"] = k.count;
  j["total_ms"] = real(static_cast<double>(k.totalNs) / 1e6);
  Json top = Json::array();
  for (const auto& s : k.top)
    top.push_back(Json{{"name", s.name}, {"count", s.count}, {"total_ms", real(static_cast<double>(s.totalNs) / 1e6)}});
  j["top"] = std::move(top);
  return j;
}
}  // namespace

std::string reportToJson(const Report& report, const std::string& file, int indent) {
  Json j;
  j["file"] = file;
  j["step_source"] = stepSourceName(report.breakdown.source);
  Json ranks = Json::array();
  for (const auto& r : report.breakdown.ranks) {
    Json x;
    x["rank"] = r.rank;
    x["lanes"] = lanesName(r.lanes);
    x["steps"] = r.steps;
    const Json t = shares(r.time);
    for (auto it = t.begin(); it != t.end(); ++it) x[it.key()] = it.value();
    ranks.push_back(std::move(x));
  }
  j["ranks"] = std::move(ranks);
  Json steps = Json::array();
  for (const auto& s : report.breakdown.steps) {
    Json x;
    x["rank"] = s.rank;
    x["step"] = s.step;
    const Json t = shares(s.time);
    for (auto it = t.begin(); it != t.end(); ++it) x[it.key()] = it.value();
    steps.push_back(std::move(x));
  }
  j["steps"] = std::move(steps);
  j["run"] = shares(report.breakdown.run);
  Json colls = Json::array();
  for (const auto& c : report.collectives.stats) {
    Json x;
    x["group"] = c.group;
    x["op"] = c.op;
    x["group_size"] = c.groupSize;
    x["count"] = c.count;
    x["incomplete"] = c.incomplete;
    x["bytes"] = c.bytes;
    x["total_ns"] = c.totalNs;
    x["latency_ns"] = c.latencyNs;
    x["algbw_gbps"] = real(c.algbwGbps);
    x["busbw_gbps"] = real(c.busbwGbps);
    x["mean_skew_ns"] = c.meanSkewNs;
    x["max_skew_ns"] = c.maxSkewNs;
    x["steps"] = c.steps;
    if (!c.emulatedBy.empty()) x["emulated_by"] = c.emulatedBy;
    colls.push_back(std::move(x));
  }
  j["collectives"] = std::move(colls);
  Json st;
  st["decided"] = report.collectives.stragglers.decided;
  st["undecided"] = report.collectives.stragglers.undecided;
  Json sr = Json::array();
  for (const auto& r : report.collectives.stragglers.ranks)
    sr.push_back(Json{{"rank", r.rank}, {"collectives", r.collectives}, {"last_count", r.lastCount},
                      {"last_pct", real(r.lastPct())}, {"caused_wait_ns", r.causedWaitNs}, {"waited_ns", r.waitedNs},
                      {"expected_wait_ns", real(r.expectedWaitNs)}, {"z", real(r.z)}, {"p_value", real(r.pValue)}});
  st["ranks"] = std::move(sr);
  j["stragglers"] = std::move(st);
  const TpModelCheck& tp = report.collectives.tp;
  Json t;
  t["have_model"] = tp.haveModel;
  t["expected_per_step"] = tp.expectedPerStep;
  t["expected_elements"] = tp.expectedElements;
  t["expected_bytes_per_step"] = tp.expectedBytesPerStep;
  t["measured_per_step"] = real(tp.measuredPerStep);
  t["measured_model_sized_per_step"] = real(tp.measuredModelSizedPerStep);
  t["expected_all_gather_per_step"] = tp.expectedAllGatherPerStep;
  t["expected_reduce_scatter_per_step"] = tp.expectedReduceScatterPerStep;
  t["measured_all_gather_per_step"] = real(tp.measuredAllGatherPerStep);
  t["measured_reduce_scatter_per_step"] = real(tp.measuredReduceScatterPerStep);
  t["measured_bytes_per_step"] = real(tp.measuredBytesPerStep);
  t["measured_bytes_each"] = tp.measuredBytesEach;
  t["busbw_gbps"] = real(tp.busbwGbps);
  t["matches"] = tp.matches;
  j["tp_model"] = std::move(t);
  if (report.pipeline.present) j["pipeline"] = pipelineJson(report.pipeline);
  if (report.kernels.present) j["kernels"] = kernelsJson(report.kernels);
  return j.dump(indent) + "\n";
}

std::string desyncToJson(const DesyncReport& report, const std::string& file, int indent) {
  Json j;
  j["file"] = file;
  Json groups = Json::array();
  for (const auto& g : report.groups) {
    Json x;
    x["group"] = g.group;
    x["members"] = g.members;
    Json prog = Json::array();
    for (const auto& p : g.progress) {
      Json y{{"rank", p.rank}, {"last_enqueued", p.lastEnqueued}, {"last_started", p.lastStarted},
             {"last_completed", p.lastCompleted}};
      y["callsite"] = p.lastRecord ? p.lastRecord->callsite : "";
      if (p.lastSpan)
        y["last_span"] = Json{{"name", p.lastSpan->name}, {"kind", p.lastSpan->kind}, {"phase", p.lastSpan->phase},
                              {"step", p.lastSpan->step}, {"layer", p.lastSpan->layer}};
      prog.push_back(std::move(y));
    }
    x["progress"] = std::move(prog);
    x["stuck_seq"] = g.stuckSeq ? Json(*g.stuckSeq) : Json(nullptr);
    x["stuck_state"] = matchStateName(g.stuckState);
    x["missing_ranks"] = g.missingRanks;
    x["waiting_ranks"] = g.waitingRanks;
    Json recs = Json::array();
    for (const auto& r : g.stuckRecords) recs.push_back(record(r));
    x["stuck_records"] = std::move(recs);
    Json mm = Json::array();
    for (const auto& m : g.mismatches) {
      Json r = Json::array();
      for (const auto& rec : m.records) r.push_back(record(rec));
      mm.push_back(Json{{"seq", m.seq}, {"state", matchStateName(m.state)}, {"records", r}});
    }
    x["mismatches"] = std::move(mm);
    x["mismatch_count"] = g.mismatchCount;
    groups.push_back(std::move(x));
  }
  j["groups"] = std::move(groups);
  return j.dump(indent) + "\n";
}

std::string diffToJson(const RunDiff& diff, const std::string& fileA, const std::string& fileB, int indent) {
  Json j;
  j["a"] = fileA;
  j["b"] = fileB;
  j["steps"] = Json{{"a", diff.stepsA}, {"b", diff.stepsB}};
  j["ranks"] = Json{{"a", diff.ranksA}, {"b", diff.ranksB}};
  Json e = Json::array();
  for (const auto& d : diff.entries)
    e.push_back(Json{{"what", d.what}, {"unit", d.unit}, {"a", real(d.a)}, {"b", real(d.b)},
                     {"change_pct", d.a != 0 ? real(d.changePct()) : Json(nullptr)}});
  j["entries"] = std::move(e);
  return j.dump(indent) + "\n";
}

}  // namespace tpscope::report
