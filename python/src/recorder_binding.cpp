// The recorder half of tpscope._native (bindings.h). Span names from Python are dynamic (module names), while the
// recorder keys span names by `const Site*` (a static site in C++): `site()` interns one Site per (name, kind,
// phase) for the life of the process and hands Python its index; the hot path is then `ticks()` and
// `span_end(site, t0, layer)` — two calls, no allocation, one ring push.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "span_api.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"

namespace py = pybind11;
namespace probes = tpscope::probes;

namespace tpscope::python {

namespace {

// Sites created from Python. Never freed (the recorder's flusher reads a pushed span's site after the caller is
// gone); bounded by the number of distinct names a program records, about its module count × phases. Only Python
// calls reach it, and they hold the GIL, which serialises them: no lock of its own on the hot path.
class SiteRegistry {
 public:
  static SiteRegistry& instance() {
    static SiteRegistry* r = new SiteRegistry();  // leaked on purpose: used by the recorder's flusher at exit
    return *r;
  }

  int intern(const std::string& name, int kind, int phase, const std::string& category) {
    if (kind < 0 || kind > static_cast<int>(probes::SpanKind::Wait))
      throw py::value_error("span kind " + std::to_string(kind) + " is not a tpscope SpanKind");
    if (phase < 0 || phase > static_cast<int>(probes::Phase::Other))
      throw py::value_error("phase " + std::to_string(phase) + " is not a tpscope Phase");
    auto key = std::make_tuple(name, kind, phase, category);
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    const std::string& n = strings_.emplace_back(name);
    const std::string& c = strings_.emplace_back(category);
    sites_.push_back(probes::Site{n.c_str(), c.c_str(), "<python>", 0, static_cast<probes::SpanKind>(kind),
                                  static_cast<probes::Phase>(phase)});
    const int id = static_cast<int>(sites_.size()) - 1;
    ids_.emplace(std::move(key), id);
    return id;
  }

  // Deque elements never move: the pointer stays valid for the process.
  const probes::Site* at(int id) const {
    const probes::Site* s = find(id);
    if (s == nullptr) throw py::index_error("unknown span site " + std::to_string(id));
    return s;
  }
  const probes::Site* find(int id) const {
    return id < 0 || static_cast<size_t>(id) >= sites_.size() ? nullptr : &sites_[static_cast<size_t>(id)];
  }

 private:
  std::deque<std::string> strings_;
  std::deque<probes::Site> sites_;
  std::map<std::tuple<std::string, int, int, std::string>, int> ids_;
};

// set_paused: while set, the package's hooks and wrappers pass every call through unrecorded. Written and read with
// the GIL held (the C hooks check it from Python's calls into them).
bool g_paused = false;

// tpscope._native._span_api (span_api.h): the same sites, clock and span push for tpscope._autograd.
const SpanApi kSpanApi{
    kSpanApiVersion,
    [](int id) -> const void* { return SiteRegistry::instance().find(id); },
    [] { return probes::rawTicks(); },
    [](const void* site, uint64_t t0, uint64_t t1, int layer) {
      if (probes::recording()) probes::emitSpan(static_cast<const probes::Site*>(site), t0, t1, layer);
    },
    &hostNonfiniteSum,
    &packageRecording,
};

py::tuple statusTuple(const tracedb::Status& s) { return py::make_tuple(s.isOk(), s.message()); }

py::tuple startExplicit(const std::filesystem::path& outDir, int rank, int worldSize, int localRank,
                        const std::string& runId, int flushMs, bool installSignalHandlers,
                        std::optional<int64_t> epochUnixNs) {
  probes::RuntimeOptions o;
  o.outDir = outDir;
  o.runId = runId;
  o.rank.rank = rank;
  o.rank.worldSize = worldSize < 1 ? 1 : worldSize;
  o.rank.localRank = localRank;
  o.rank.dpSize = o.rank.worldSize;
  o.rank.dpRank = rank;
  if (flushMs > 0) o.flushInterval = std::chrono::milliseconds(flushMs);
  o.installSignalHandlers = installSignalHandlers;
  o.epochUnixNs = epochUnixNs;
  o.tool = "tpscope 0.1.0 (python)";
  return statusTuple(probes::start(o));
}

void collectiveState(uint64_t handle, int state, uint64_t ticks) {
  if (state < 0 || state > static_cast<int>(probes::CollectiveState::Failed))
    throw py::value_error("collective state " + std::to_string(state) + " is not a tpscope CollectiveState");
  if (probes::Sink* sink = probes::sink())
    sink->collectiveState(handle, static_cast<probes::CollectiveState>(state),
                          ticks != 0 ? ticks : probes::rawTicks());
}

void stepStat(int step, double loss, double lr, double gradNorm, double lossScale, int64_t tokens, uint64_t t0,
              uint64_t t1, bool skipped) {
  probes::Sink* sink = probes::sink();
  if (sink == nullptr) return;
  probes::StepStat s;
  s.step = step;
  s.loss = loss;
  s.lr = lr;
  s.gradNorm = gradNorm;
  s.lossScale = lossScale;
  s.tokens = tokens;
  s.t0 = t0;
  s.t1 = t1 != 0 ? t1 : probes::rawTicks();
  s.skipped = skipped;
  sink->stepStat(s);
}

void alert(int severity, const std::string& kind, int step, int layer, const std::string& param,
           const std::string& message, const std::string& evidence, uint64_t ticks) {
  if (severity < 0 || severity >= static_cast<int>(vocabulary::kSeverityNames.size()))
    throw py::value_error("severity " + std::to_string(severity) + " is not a tpscope Severity");
  probes::Sink* sink = probes::sink();
  if (sink == nullptr) return;
  probes::Alert a;
  a.severity = static_cast<probes::Severity>(severity);
  a.kind = kind;
  a.step = step;
  a.layer = layer;
  a.param = param;
  a.message = message;
  a.evidence = evidence.empty() ? std::string_view("{}") : std::string_view(evidence);
  a.ticks = ticks;
  sink->alert(a);
}

void setRankInfo(int tpRank, int tpSize, int dpRank, int dpSize, const std::string& device,
                 const std::string& host) {
  tracedb::RankInfo info;
  info.tpRank = tpRank;
  info.tpSize = tpSize;
  info.dpRank = dpRank;
  info.dpSize = dpSize;
  info.device = device;
  info.host = host;
  probes::setRankInfo(info);  // rank, world size, local rank, pid and the clock stay the runtime's
}

py::dict recorderStats() {
  const probes::RecorderStats s = probes::recorderStats();
  py::dict d;
  d["spans_written"] = s.spansWritten;
  d["spans_dropped"] = s.spansDropped;
  d["records_written"] = s.recordsWritten;
  d["records_dropped"] = s.recordsDropped;
  d["flushes"] = s.flushes;
  d["flush_ns_max"] = s.flushNsMax;
  d["flush_ns_total"] = s.flushNsTotal;
  d["flush_cpu_ns_total"] = s.flushCpuNsTotal;
  d["per_span_cost_ps"] = s.perSpanCostPs;
  return d;
}

}  // namespace

bool packageRecording() {
  return !g_paused && probes::recording();
}

const probes::Site* spanSite(int id) {
  return SiteRegistry::instance().find(id);
}

// The catalogues of probes.h as ints (tpscope._native.kinds): the Python side names them from here, never by number.
static void bindKinds(py::module_& m) {
  py::module_ k = m.def_submodule("kinds", "SpanKind, Phase, CollectiveState, Severity of probes.h as ints");
  auto put = [&k](const char* name, auto value) { k.attr(name) = static_cast<int>(value); };
  using probes::SpanKind, probes::Phase, probes::CollectiveState, probes::Severity;
  put("SPAN_COMPUTE", SpanKind::Compute);
  put("SPAN_COMM", SpanKind::Comm);
  put("SPAN_DATA", SpanKind::Data);
  put("SPAN_OPTIMIZER", SpanKind::Optimizer);
  put("SPAN_STEP", SpanKind::Step);
  put("SPAN_OTHER", SpanKind::Other);
  put("SPAN_WAIT", SpanKind::Wait);
  put("PHASE_NONE", Phase::None);
  put("PHASE_FORWARD", Phase::Forward);
  put("PHASE_BACKWARD", Phase::Backward);
  put("PHASE_OPTIMIZER", Phase::Optimizer);
  put("PHASE_DATA", Phase::Data);
  put("PHASE_OTHER", Phase::Other);
  put("STATE_STARTED", CollectiveState::Started);
  put("STATE_COMPLETED", CollectiveState::Completed);
  put("STATE_TIMED_OUT", CollectiveState::TimedOut);
  put("STATE_FAILED", CollectiveState::Failed);
  put("SEVERITY_INFO", Severity::Info);
  put("SEVERITY_WARNING", Severity::Warning);
  put("SEVERITY_ERROR", Severity::Error);
  put("SEVERITY_CRITICAL", Severity::Critical);
}

void bindRecorder(py::module_& m) {
  using namespace py::literals;
  bindKinds(m);
  // The package's spans are timed in Python and emitted when they end: the threads' open-span stacks would say "no
  // span open" where one is (a live watcher then says nothing of where the rank is).
  probes::publishOpenSpans(false);
  // ---- session ----
  m.def("start_from_environment", [] { return statusTuple(probes::startFromEnvironment()); },
        "Starts recording when TPSCOPE_OUT is set (docs/recorder.md); returns (ok, message). OK and not recording "
        "when it is unset; OK when already started.");
  m.def("start", &startExplicit, "out_dir"_a, "rank"_a = 0, "world_size"_a = 1, "local_rank"_a = 0,
        "run_id"_a = "", "flush_ms"_a = 0, "install_signal_handlers"_a = true, "epoch_unix_ns"_a = py::none(),
        "Starts recording into OUT_DIR/rank-RANK.db; returns (ok, message).");
  m.def("stop", [](const std::string& reason) { probes::stop(reason); }, "exit_reason"_a = "ok",
        "Final flush, ranks.exit_reason, closes the file. No-op when not started.");
  m.def("flush", &probes::flushNow, "Commits everything recorded so far (at most 5 s).");
  m.def("started", &probes::started);
  m.def("recording", &packageRecording,
        "Whether the package's hooks record now: started and not paused (one relaxed atomic load and a flag).");
  m.def(
      "set_paused", [](bool paused) { g_paused = paused; }, "paused"_a,
      "While PAUSED, recording() is False: every hook and wrapper of the package passes its calls through "
      "unrecorded, the recorder staying started (bench/python/overhead_alternating.py's OFF steps).");
  m.def("output_path", [] { return probes::outputPath(); });
  m.def("recorder_stats", &recorderStats);
  m.def("set_rank_info", &setRankInfo, "tp_rank"_a, "tp_size"_a, "dp_rank"_a, "dp_size"_a, "device"_a = "cpu",
        "host"_a = "");
  m.def("set_meta", [](const std::string& k, const std::string& v) { probes::setMeta(k, v); });
  m.def("put_group", [](const std::string& name, const std::vector<int>& ranks, const std::string& backend) {
    probes::putGroup({name, ranks, backend});
  });
  m.def("set_thread_name", [](const std::string& name) { probes::setThreadName(name); });
  // ---- steps, time, spans (the hot path) ----
  m.def("set_step", &probes::setStep, "step"_a);
  m.def("current_step", &probes::currentStep);
  m.def("ticks", &probes::rawTicks, "Raw clock ticks (the TSC on x86-64); converted to ns when flushed.");
  m.def("site", [](const std::string& name, int kind, int phase, const std::string& category) {
    return SiteRegistry::instance().intern(name, kind, phase, category);
  }, "name"_a, "kind"_a, "phase"_a, "category"_a = "python",
        "Interns a span site (name, SpanKind, Phase) for the life of the process; returns its id.");
  m.def("span_end", [](int site, uint64_t t0, int layer) {
    if (probes::recording()) probes::emitSpan(SiteRegistry::instance().at(site), t0, probes::rawTicks(), layer);
  }, "site"_a, "t0"_a, "layer"_a = -1, "Records a span from T0 (ticks()) to now.");
  m.def("emit_span", [](int site, uint64_t t0, uint64_t t1, int layer) {
    if (probes::recording()) probes::emitSpan(SiteRegistry::instance().at(site), t0, t1, layer);
  }, "site"_a, "t0"_a, "t1"_a, "layer"_a = -1);
  m.attr("_span_api") = py::capsule(&kSpanApi, TPSCOPE_SPAN_API_CAPSULE);
  // ---- records ----
  // A collective's record: collective_issue (collective_fastpath.cpp), on interned ids.
  m.def("collective_state", &collectiveState, "handle"_a, "state"_a, "ticks"_a = 0,
        "state: 1 started, 2 completed, 3 timed out, 4 failed; ticks 0 = now.");
  m.def("step_stat", &stepStat, "step"_a, "loss"_a, "lr"_a = 0.0, "grad_norm"_a = 0.0, "loss_scale"_a = 1.0,
        "tokens"_a = 0, "t0"_a = 0, "t1"_a = 0, "skipped"_a = false);
  m.def("alert", &alert, "severity"_a, "kind"_a, "step"_a = -1, "layer"_a = -1, "param"_a = "", "message"_a = "",
        "evidence"_a = "{}", "ticks"_a = 0);
  m.def("counter", [](const std::string& name, double value) { probes::counter(name, value); });
}

}  // namespace tpscope::python
