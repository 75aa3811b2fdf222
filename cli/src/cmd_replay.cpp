// tpscope replay RUN [--step S] [--rank R] [--json]: the step again, op by op. Re-runs a tpscope-train run's job up to
// step S through `tpscope capture` (same program, layout, config and the faults that model a program's own bug; from
// the state the run kept for S — then, with DP > 1, the named rank's DP replica alone — else from the run's newest
// checkpoint before S when it has one), with the op check (core/op_check.h) armed at step S on every rank; reads back
// each rank's first non-finite operator and gives the verdict: reproducible (the value comes back: a numerical or data
// problem, the op and the batch named), transient (the replay is clean: suspect the hardware) or clean (neither the run
// nor the replay had a non-finite value at S). The verdict goes into the run file (an alert of kind `replay`, which
// diagnose turns into a `replay` finding under the NaN's origin) and the replay's own run stays in RUN's folder,
// replay-step-S/. docs/cli.md ("replay") is the user's page.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "capture/launcher.h"
#include "command.h"
#include "text.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/analysis/sdc.h"
#include "tpscope/rules/fault_spec.h"
#include "tpscope/tracedb/rank_file.h"
#include "tpscope/vocabulary/alert_kinds.h"

namespace tpscope::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
namespace kinds = vocabulary::alert_kinds;

constexpr const char* kHelp = R"(
Re-runs a run of tpscope-train up to step S, with every operator's outputs (forward ops, the backward functions
autograd runs) and every collective's result checked for NaN/Inf at step S, and names the first operator that made
the value on each rank. The job runs again from the first of: the state the run kept for S (RUN/replay-state:
written before the update of the first step with a non-finite value; not used where a parameter of it already
carries the value or the run's replica check dates a disagreement before S), the run's newest checkpoint before S,
step 1 (the engine's data order, initialisation and dropout are functions of the seed and the step, and a checkpoint
holds the RNG state). From the kept state with DP > 1 only the named rank's DP replica runs (its TP group and
pipeline stages, as a job of dp 1 that draws that replica's data), and where it makes nothing the whole job runs
the step again; else every rank. The step's gradients before
reduction are compared with the run's. The faults that model a program's own bug are re-applied
(nan, inf, spike) and those that model the machine or the schedule left out (bitflip, slow, delay, hang, crash,
mismatch). Checkpoints are not written.

Verdict:
  reproducible  the replay makes the value again: a numerical or data problem (the op, its inputs and the batch
                are named)
  transient     the run had a non-finite value at S, the replay has none: suspect the hardware (the silent-
                corruption checks' view of the rank is shown)
  clean         neither the run nor the replay has one at S

The verdict is stored in RUN (alert kind 'replay'; `tpscope diagnose` shows it as a 'replay' finding under the
NaN's origin); the replay's own run is RUN's folder/replay-step-S/run.db.
Exit: 0 the replay ran (any verdict); 1 the replay failed; 2 bad input (not a capture of tpscope-train, bad step).
)";

struct ReplayArgs {
  fs::path run;
  std::optional<int> step, rank;
  bool json = false;
  bool noState = false;  // --no-replay-state
  double hangTimeoutS = 120;
};

// Splits a command line written by shellQuote (session_prepare.cpp): words, single-quoted where needed.
std::vector<std::string> splitCommand(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, escaped = false, any = false;
  for (char c : s) {
    if (escaped) {  // \' between quoted parts: a literal quote
      cur += c;
      escaped = false;
    } else if (quoted) {
      if (c == '\'')
        quoted = false;
      else
        cur += c;
    } else if (c == '\'' || c == '\\') {
      (c == '\'' ? quoted : escaped) = true;
      any = true;
    } else if (c == ' ') {
      if (any) out.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) out.push_back(cur);
  return out;
}

// The value after `flag` in argv, removing both when `erase`.
std::optional<std::string> takeFlag(std::vector<std::string>& argv, const std::string& flag, bool erase) {
  for (size_t i = 1; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) {
      std::string v = argv[i + 1];
      if (erase) argv.erase(argv.begin() + static_cast<long>(i), argv.begin() + static_cast<long>(i) + 2);
      return v;
    }
  return std::nullopt;
}

// The newest step folder of a checkpoint root (core/checkpoint.h: <root>/step-NNNNNN with a manifest.json) whose step
// is before `step`, as (its step, its path); relative roots are the capture's, read from here.
std::optional<std::pair<int, fs::path>> newestCheckpointBefore(const std::string& root, int step) {
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return std::nullopt;
  std::optional<std::pair<int, fs::path>> best;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("step-") || !fs::exists(e.path() / "manifest.json", ec)) continue;
    char* end = nullptr;
    const long n = std::strtol(name.c_str() + 5, &end, 10);
    if (*end != '\0' || n < 1 || n >= step) continue;
    if (!best || n > best->first) best = std::make_pair(static_cast<int>(n), fs::absolute(e.path()));
  }
  return best;
}

// The replay state the run kept for step `step` (tpscope-train writes it before the update of the first step with a
// non-finite value: core/trainer.h): RUN/replay-state/step-<S-1>/, used only where the file of every rank in `ranks`
// is there.
std::optional<fs::path> replayStateFor(const fs::path& runDir, int step, const std::vector<int>& ranks) {
  std::error_code ec;
  const fs::path dir = runDir / "replay-state" / fmt::format("step-{:06d}", step - 1);
  if (step < 2 || !fs::exists(dir / "manifest.json", ec)) return std::nullopt;
  for (int r : ranks)
    if (!fs::exists(dir / fmt::format("rank-{:05d}.pt", r), ec)) return std::nullopt;
  return fs::absolute(dir, ec);
}

struct RankResult {
  int rank = -1;
  bool found = false, clean = false;
  Json evidence;
  std::string message;
  int64_t tsNs = 0;
};

struct Outcome {
  std::string verdict;  // reproducible, transient, clean
  int rank = -1;        // the rank whose op is named (the replay's origin, else the asked rank)
  std::vector<RankResult> ranks;
  std::optional<double> lossMaxRelDiff;  // steps before S: the replay's losses against the run's (0: identical)
  int lossSteps = 0;
  // Step S's gradients before reduction (each tensor's L2 norm and max |g|, finite in both), the replay's against the
  // run's rank by rank: equal where the replay computed what the run computed (the data, the state, the seeds).
  std::optional<double> gradMaxRelDiff;
  int gradTensors = 0, gradRanks = 0;
  std::vector<std::string> reapplied, leftOut;
  std::vector<std::string> sdc;  // transient: the silent-corruption findings on the rank
  bool runHadNonFinite = false;
  std::string batch;  // reproducible: the batch of the named rank
  fs::path replayRun;
};

class Replay {
 public:
  explicit Replay(const ReplayArgs& a) : a_(a) {}

  int run() {
    if (int rc = readRun(); rc != kExitOk) return rc;
    if (int rc = runCapture(); rc != kExitOk) return rc;
    if (int rc = readReplay(); rc != kExitOk) return rc;
    if (fromState_) {
      // The state the step began from already held the value (a parameter carried it into the step's first bad
      // operator): it was made before S — by a flipped bit in memory, or by an earlier step's update. Only a replay
      // from before it can tell: from the newest checkpoint, else from step 1.
      const RankResult* r = named();
      if (r != nullptr && r->found && !r->evidence.value("carrier_param", "").empty()) {
        stateHeld_ = r->evidence.value("carrier_param", "");
        fromState_ = false;
        replica_ = -1;  // the steps before S need every replica
        if (int rc = againWholeJob(); rc != kExitOk) return rc;
      }
    }
    if (replica_ >= 0 && out_.verdict == "transient") {
      // The replica alone made nothing: the value may have come from another replica (through the DP reduction) or
      // been born in it. Before the verdict suspects the hardware, the whole job runs the step: from the state the run
      // kept where every rank's file is there, else from before it.
      replicaClean_ = replica_;
      replica_ = -1;
      if (auto state = replayStateFor(file_.parent_path(), step_, jobRanks()))
        setProgram(std::make_pair(step_ - 1, *state));
      else
        fromState_ = false;
      if (int rc = againWholeJob(); rc != kExitOk) return rc;
    }
    record();
    if (a_.json)
      std::cout << toJson().dump(2) << "\n";
    else
      printText();
    return kExitOk;
  }

 private:
  int bad(const std::string& why) {
    printError("replay", why);
    return kExitBadInput;
  }

  // A run of another program: replay re-runs tpscope-train only. A Python program replays its step inside the run,
  // through its hook (tpscope.set_step_replay): where it did, its verdict is named.
  int notTheEngine(tracedb::Reader& reader, const std::vector<std::string>& argv) {
    std::string done;
    if (auto alerts = reader.alerts())
      for (const auto& a : *alerts)
        if (a.kind == vocabulary::alert_kinds::kReplay)
          done = fmt::format("; this run replayed step {} through the program's hook: {} (tpscope diagnose {})", a.step,
                             a.message, file_.string());
    const bool python = argv.size() > 1 && argv.front().find("python") != std::string::npos;
    return bad(fmt::format("{}: its program is {}; replay re-runs tpscope-train runs{}{}", file_.string(), argv.front(),
                           python ? ". A Python program replays the step in the run when it gives tpscope the step "
                                    "(tpscope.set_step_replay), or traces the next one (--on-nonfinite trace-ops)"
                                  : "",
                           done));
  }

  int readRun() {
    std::error_code ec;
    file_ = fs::is_directory(a_.run, ec) ? a_.run / "run.db" : a_.run;
    auto reader = openRun(file_);
    if (!reader) return kExitBadInput;
    std::vector<std::string> argv;
    if (auto j = reader->metaValue("capture_argv")) {
      Json parsed = Json::parse(*j, nullptr, false);
      if (parsed.is_array())
        for (const auto& w : parsed)
          if (w.is_string()) argv.push_back(w.get<std::string>());
    }
    if (argv.empty())
      if (auto c = reader->metaValue("capture_command")) argv = splitCommand(*c);
    if (argv.empty()) return bad(file_.string() + ": not a capture (no capture_command): replay re-runs captured runs");
    if (fs::path(argv.front()).filename() != "tpscope-train") return notTheEngine(*reader, argv);
    auto info = analysis::loadRunInfo(*reader);
    if (!info) return bad(info.error());
    world_ = static_cast<int>(info->ranks.size());
    for (const auto& r : info->ranks) {
      tp_ = std::max(tp_, r.tpSize);
      dp_ = std::max(dp_, r.dpSize);
    }
    if (world_ < 1 || tp_ < 1 || dp_ < 1 || world_ % (tp_ * dp_) != 0)
      return bad(
          fmt::format("{}: cannot read the job's layout ({} ranks, tp {}, dp {})", file_.string(), world_, tp_, dp_));
    pp_ = world_ / (tp_ * dp_);
    // The step and rank: asked, else the run's NaN/Inf origin.
    auto nf = analysis::analyzeNonFinite(*reader, *info);
    if (!nf) return bad(nf.error());
    nonfinite_ = std::move(*nf);
    if (a_.step)
      step_ = *a_.step;
    else if (nonfinite_.origin)
      step_ = nonfinite_.origin->step;
    else
      return bad(file_.string() + ": no NaN or Inf in this run: give the step to replay (--step S)");
    if (step_ < 1) return bad(fmt::format("--step {} must be >= 1", step_));
    rank_ = a_.rank ? *a_.rank : nonfinite_.origin && nonfinite_.origin->step == step_ ? nonfinite_.origin->rank : 0;
    if (rank_ < 0 || rank_ >= world_) return bad(fmt::format("--rank {}: the run has ranks 0-{}", rank_, world_ - 1));
    for (const auto& e : nonfinite_.firstPerRank) out_.runHadNonFinite |= e.step == step_;
    if (auto s = reader->stepStats()) stepStats_ = std::move(*s);
    if (auto sdc = analysis::silentCorruptionFindings(*reader))
      for (const auto& fd : *sdc) {
        if (fd.rank == rank_ || fd.rank < 0) out_.sdc.push_back(fd.message);
        // A copy that disagreed before S: the state the run kept for S holds it.
        if (fd.step >= 1 && fd.step < step_ && stateSkipped_.empty())
          stateSkipped_ = fmt::format(
              "the run's silent-corruption check dates a disagreement to step {}, before {}: "
              "the state kept for step {} may hold it",
              fd.step, step_, step_);
      }
    // The program: its flags kept (its --steps too: the learning-rate schedule spans them), stopped after step S, no
    // checkpoints written, no metrics file appended to.
    (void)takeFlag(argv, "--stop-after", true);
    (void)takeFlag(argv, "--metrics-jsonl", true);
    std::vector<std::string> injects;
    while (auto i = takeFlag(argv, "--inject", true)) injects.push_back(*i);
    (void)takeFlag(argv, "--resume", true);
    if (auto cfg = reader->metaValue("config")) {
      Json c = Json::parse(*cfg, nullptr, false);
      if (c.is_object()) {
        microBatch_ = c.value("micro_batch_size", int64_t{1});
        gradAccum_ = c.value("grad_accum", int64_t{1});
        zero1_ = c.value("zero1", false);
        // The run's newest checkpoint before the step: the replay starts there instead of at step 1.
        checkpoint_ = newestCheckpointBefore(c.value("checkpoint_dir", ""), step_);
      }
    }
    program_ = std::move(argv);
    // The state the run kept when the step's non-finite value appeared: the step alone is replayed.
    if (a_.noState) stateSkipped_ = "--no-replay-state";
    // From that state the step needs only the rank's DP replica: its TP groups, every stage (the step's forward and
    // backward passes do not depend on the other replicas; ZeRO-1 spreads the optimizer state over them).
    if (dp_ > 1 && !zero1_) replica_ = (rank_ / tp_) % dp_;
    auto state = replayStateFor(file_.parent_path(), step_, jobRanks());
    if (!state && replica_ >= 0) {
      replica_ = -1;
      state = replayStateFor(file_.parent_path(), step_, jobRanks());
    }
    if (!state) stateSkipped_.clear();  // nothing kept: nothing skipped
    if (state && stateSkipped_.empty()) {
      fromState_ = true;
      setProgram(std::make_pair(step_ - 1, *state));
    } else {
      replica_ = -1;  // the steps before S need every replica
      setProgram(checkpoint_);
    }
    // The faults: those that model a program's own bug come back; the machine's and the schedule's do not.
    std::string all = reader->metaValue("capture_inject").value_or("");
    for (const auto& i : injects) all += (all.empty() ? "" : ";") + i;
    std::string error;
    auto specs = rules::parseFaultList(all, &error);
    if (!specs) return bad(file_.string() + ": " + error);
    faults_ = std::move(*specs);
    chooseFaults();
    if (auto g = reader->gradStats(tracedb::GradQuery{.rank = std::nullopt, .step = step_})) runGrads_ = std::move(*g);
    return kExitOk;
  }

  // The run's ranks the replay runs, in the replay's rank order: every rank, or those of DP replica `replica_`
  // (stage by stage, TP fastest: mesh.h's order with dp 1).
  std::vector<int> jobRanks() const {
    std::vector<int> out(static_cast<size_t>(replica_ < 0 ? world_ : tp_ * pp_));
    for (size_t r = 0; r < out.size(); ++r) out[r] = jobRankOf(static_cast<int>(r));
    return out;
  }

  // The replay again, on every rank (replica_ is -1), from the kept state or (fromState_ false) from before it. The
  // replay's own results start again; what the run says is kept.
  int againWholeJob() {
    chooseFaults();
    if (!fromState_) setProgram(checkpoint_);
    Outcome kept;
    kept.reapplied = out_.reapplied;
    kept.leftOut = out_.leftOut;
    kept.sdc = out_.sdc;
    kept.runHadNonFinite = out_.runHadNonFinite;
    out_ = std::move(kept);
    if (int rc = runCapture(); rc != kExitOk) return rc;
    return readReplay();
  }

  // A replica's replay names its pipeline's point-to-point groups by its own ranks (p2p-<src>-<dst>): the run's.
  std::string inRunTerms(const std::string& text) const {
    if (replica_ < 0) return text;
    static const std::regex kP2p("p2p-(\\d+)-(\\d+)");
    std::string out;
    auto from = text.cbegin();
    for (std::sregex_iterator it(text.begin(), text.end(), kP2p), end; it != end; ++it) {
      out.append(from, text.cbegin() + it->position());
      out += fmt::format("p2p-{}-{}", jobRankOf(std::stoi((*it)[1])), jobRankOf(std::stoi((*it)[2])));
      from = text.cbegin() + it->position() + it->length();
    }
    out.append(from, text.cend());
    return out;
  }

  // The run's rank that replay rank `replayRank` stands for (core/mesh.h Mesh::jobRank: stage, replica, TP rank).
  int jobRankOf(int replayRank) const {
    if (replica_ < 0) return replayRank;
    return (replayRank / tp_ * dp_ + replica_) * tp_ + replayRank % tp_;
  }

  // The faults the replay applies (those that model a program's own bug, on a rank it runs, renumbered to the
  // replay's ranks) and those it leaves out.
  void chooseFaults() {
    out_.reapplied.clear();
    out_.leftOut.clear();
    inject_.clear();
    const std::vector<int> ranks = jobRanks();
    for (const auto& s : faults_) {
      const std::string text = rules::formatFaultSpec(s);
      const bool program =
          s.kind == rules::FaultKind::Nan || s.kind == rules::FaultKind::Inf || s.kind == rules::FaultKind::Spike;
      rules::FaultSpec mine = s;
      bool here = true;
      if (s.stage >= 0) {
        here = replica_ <= 0;  // a stage's fault is on its first rank: DP replica 0's
      } else {
        const auto it = std::find(ranks.begin(), ranks.end(), s.rank);
        here = it != ranks.end();
        mine.rank = static_cast<int>(it - ranks.begin());
      }
      if (!program || !here) {
        out_.leftOut.push_back(text + (program ? " (another DP replica)" : ""));
        continue;
      }
      out_.reapplied.push_back(text);
      inject_.push_back(rules::formatFaultSpec(mine));
    }
  }

  int runCapture() {
    capture::CaptureOptions o;
    o.nproc = static_cast<int>(jobRanks().size());
    o.tp = tp_;
    o.dp = replica_ >= 0 ? 1 : dp_;
    o.pp = pp_;
    o.program = argv_;
    if (replica_ >= 0) {  // tpscope-train's own --dp: the replica's job has one
      for (size_t i = 0; i < o.program.size(); ++i)
        if (o.program[i] == "--dp" && i + 1 < o.program.size())
          o.program[i + 1] = "1";
        else if (o.program[i].starts_with("--dp="))
          o.program[i] = "--dp=1";
    }
    o.out = file_.parent_path() / fmt::format("replay-step-{}", step_);
    o.inject = inject_;
    o.onNonfinite = "warn";
    o.self = selfPath();
    o.hangTimeoutS = a_.hangTimeoutS;
    o.maxFindings = 0;
    std::error_code ec;
    fs::create_directories(o.out, ec);
    const fs::path log = o.out / "capture.txt";
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (f == nullptr) {
      printError("replay", fmt::format("cannot write {}", log.string()));
      return kExitOutput;
    }
    if (!a_.json)
      std::cerr << fmt::format("tpscope replay: re-running {} rank{} up to step {} (log: {})\n", o.nproc,
                               o.nproc == 1 ? "" : "s", step_, log.string());
    setenv("TPSCOPE_REPLAY_STEP", std::to_string(step_).c_str(), 1);
    if (replica_ >= 0) setenv("TPSCOPE_REPLAY_DP", fmt::format("{}/{}", replica_, dp_).c_str(), 1);
    const int rc = capture::runCapture(o, f, f, false);
    unsetenv("TPSCOPE_REPLAY_STEP");
    unsetenv("TPSCOPE_REPLAY_DP");
    std::fclose(f);
    captureRc_ = rc;
    out_.replayRun = o.out / "run.db";
    if (rc == capture::kExitBadArgs) {
      printError("replay", fmt::format("the replay's capture refused to start (see {})", log.string()));
      return kExitInternal;
    }
    return kExitOk;
  }

  int readReplay() {
    auto reader = openRun(out_.replayRun);
    if (!reader) {
      printError("replay", fmt::format("the replay wrote no run (capture exit {})", captureRc_));
      return kExitInternal;
    }
    auto alerts = reader->alerts();
    if (!alerts) {
      printError("replay", alerts.error());
      return kExitInternal;
    }
    std::map<int, RankResult> byRank;
    for (const auto& a : *alerts) {
      if (a.step != step_ || (a.kind != kinds::kOpCheck && a.kind != kinds::kOpCheckClean)) continue;
      RankResult& r = byRank[jobRankOf(a.rank)];
      if (r.found || r.clean) continue;
      r.rank = jobRankOf(a.rank);
      r.found = a.kind == kinds::kOpCheck;
      r.clean = !r.found;
      r.evidence = Json::parse(a.evidence, nullptr, false);
      r.message = inRunTerms(a.message);
      if (r.evidence.is_object() && r.evidence.contains("collective"))
        r.evidence["collective"] = inRunTerms(r.evidence.value("collective", ""));
      r.tsNs = a.tsNs;
    }
    for (auto& [rank, r] : byRank) out_.ranks.push_back(r);
    if (out_.ranks.empty()) {
      printError("replay", fmt::format("no rank reached step {} in the replay (capture exit {}; see {})", step_,
                                       captureRc_, (out_.replayRun.parent_path() / "capture.txt").string()));
      return kExitInternal;
    }
    // The origin in the replay: a rank where an operator made the value (every input finite, not a collective's
    // result), the earliest; else the earliest rank that saw one.
    const RankResult* origin = nullptr;
    for (int pass = 0; pass < 2 && origin == nullptr; ++pass)
      for (const auto& r : out_.ranks)
        if (r.found && (pass == 1 || r.evidence.value("op", "") != "collective") &&
            (origin == nullptr || r.tsNs < origin->tsNs))
          origin = &r;
    out_.verdict = origin ? "reproducible" : out_.runHadNonFinite ? "transient" : "clean";
    out_.rank = origin ? origin->rank : rank_;
    // The losses before S: the replay is the run again only if they match.
    auto replayStats = reader->stepStats();
    if (replayStats) {
      std::map<std::pair<int, int>, double> mine;
      for (const auto& s : stepStats_)
        if (s.loss && s.step < step_) mine[{s.rank, s.step}] = *s.loss;
      double worst = 0;
      std::set<int> steps;
      for (const auto& s : *replayStats) {
        auto it = mine.find({jobRankOf(s.rank), s.step});
        if (!s.loss || it == mine.end()) continue;
        steps.insert(s.step);
        const double d = std::abs(*s.loss - it->second) / std::max(std::abs(it->second), 1e-30);
        worst = std::isnan(d) ? (std::isnan(*s.loss) && std::isnan(it->second) ? worst : INFINITY) : std::max(worst, d);
      }
      out_.lossSteps = static_cast<int>(steps.size());
      if (!steps.empty()) out_.lossMaxRelDiff = worst;
    }
    compareGradients(*reader);
    if (origin) {
      // The batch the named rank computed at S: the engine's sample order (core/data.h).
      const int dpRank = (out_.rank / tp_) % dp_;
      const int mb = origin->evidence.value("microbatch", -1);
      const int64_t first = static_cast<int64_t>(step_ - 1) * gradAccum_ * dp_;
      if (mb >= 0) {
        const int64_t g = (static_cast<int64_t>(step_ - 1) * gradAccum_ + mb) * dp_ + dpRank;
        out_.batch = fmt::format("micro-batch {} of DP rank {}: global micro-batch {}, samples {}-{}", mb, dpRank, g,
                                 g * microBatch_, g * microBatch_ + microBatch_ - 1);
      } else {
        out_.batch = fmt::format("DP rank {}'s micro-batches of step {} (global micro-batches from {}, {} per DP rank)",
                                 dpRank, step_, first + dpRank, gradAccum_);
      }
    }
    return kExitOk;
  }

  void compareGradients(tracedb::Reader& replay) {
    auto mineRows = replay.gradStats(tracedb::GradQuery{.rank = std::nullopt, .step = step_});
    if (!mineRows) return;
    const auto finite = [](const tracedb::GradStatRow& g) {
      return g.nanCount == 0 && g.infCount == 0 && std::isfinite(g.l2Norm) && std::isfinite(g.maxAbs);
    };
    std::map<std::pair<int, std::string>, const tracedb::GradStatRow*> run;
    for (const auto& g : runGrads_)
      if (finite(g)) run[{g.rank, g.param}] = &g;
    double worst = 0;
    std::set<int> ranks;
    int tensors = 0;
    const auto rel = [](double a, double b) { return a == b ? 0.0 : std::abs(a - b) / std::max(std::abs(b), 1e-30); };
    for (const auto& g : *mineRows) {
      auto it = run.find({jobRankOf(g.rank), g.param});
      if (!finite(g) || it == run.end()) continue;
      worst = std::max({worst, rel(g.l2Norm, it->second->l2Norm), rel(g.maxAbs, it->second->maxAbs)});
      ranks.insert(jobRankOf(g.rank));
      ++tensors;
    }
    if (tensors == 0) return;
    out_.gradMaxRelDiff = worst;
    out_.gradTensors = tensors;
    out_.gradRanks = static_cast<int>(ranks.size());
  }

  const RankResult* named() const {
    for (const auto& r : out_.ranks)
      if (r.rank == out_.rank) return &r;
    return nullptr;
  }

  Json toJson() const {
    Json ranks = Json::array();
    for (const auto& r : out_.ranks) {
      Json j{{"rank", r.rank}, {"finite", !r.found}, {"message", r.message}};
      if (r.found)
        j["op"] = r.evidence;
      else
        j["ops_checked"] = r.evidence.value("ops_checked", int64_t{0});
      ranks.push_back(std::move(j));
    }
    Json j{{"file", file_.string()},
           {"step", step_},
           {"rank", out_.rank},
           {"verdict", out_.verdict},
           {"run_had_nonfinite", out_.runHadNonFinite},
           {"from_step", fromStep_},
           {"from", fromState_      ? "replay_state"
                    : fromStep_ > 1 ? "checkpoint"
                                    : "start"},
           {"replayed_ranks", jobRanks()},
           {"faults_reapplied", out_.reapplied},
           {"faults_left_out", out_.leftOut},
           {"replay_run", out_.replayRun.string()},
           {"capture_exit", captureRc_},
           {"ranks", ranks}};
    if (const RankResult* r = named(); r != nullptr && r->found) j["op"] = r->evidence;
    if (!out_.batch.empty()) j["batch"] = out_.batch;
    if (out_.lossMaxRelDiff) j["losses_before"] = {{"steps", out_.lossSteps}, {"max_rel_diff", *out_.lossMaxRelDiff}};
    if (out_.gradMaxRelDiff)
      j["gradients_at_step"] = {
          {"tensors", out_.gradTensors}, {"ranks", out_.gradRanks}, {"max_rel_diff", *out_.gradMaxRelDiff}};
    if (replica_ >= 0) j["dp_replica"] = replica_;
    if (replicaClean_ >= 0) j["dp_replica_clean"] = replicaClean_;
    if (out_.verdict == "transient") j["silent_corruption"] = out_.sdc;
    if (!stateHeld_.empty()) j["replay_state_held"] = stateHeld_;
    if (!stateSkipped_.empty()) j["replay_state_skipped"] = stateSkipped_;
    return j;
  }

  void printText() const {
    const std::string layout = fmt::format("tp {}, dp {}{}", tp_, dp_, pp_ > 1 ? fmt::format(", pp {}", pp_) : "");
    if (replica_ >= 0)
      std::cout << fmt::format("replay of step {} ({}): DP replica {} alone, ranks {} of the run's {} ({}), from {}\n",
                               step_, file_.string(), replica_, rankList(jobRanks()), world_, layout, fromText());
    else
      std::cout << fmt::format("replay of step {} ({}): {} rank{} ({}), from {}\n", step_, file_.string(), world_,
                               world_ == 1 ? "" : "s", layout, fromText());
    if (!stateSkipped_.empty())
      std::cout << "the state the run kept for the step is not used: " << stateSkipped_ << "\n";
    if (replicaClean_ >= 0)
      std::cout << fmt::format("DP replica {} alone made no NaN/Inf at step {}: the whole job ran the step again\n",
                               replicaClean_, step_);
    if (!stateHeld_.empty())
      std::cout << fmt::format(
          "the state the run kept for step {} already held the value ({}): replayed from {} "
          "to see whether recomputing it makes it again\n",
          step_, stateHeld_, fromText());
    auto list = [](const std::vector<std::string>& v) { return v.empty() ? std::string("none") : join(v, "; "); };
    std::cout << "faults re-applied: " << list(out_.reapplied) << "; left out: " << list(out_.leftOut) << "\n";
    if (out_.lossMaxRelDiff)
      std::cout << (*out_.lossMaxRelDiff == 0
                        ? fmt::format("steps before {}: the replay's losses are the run's, bit for bit ({} steps)\n",
                                      step_, out_.lossSteps)
                        : fmt::format("steps before {}: the replay's losses differ from the run's by up to {:.3g} "
                                      "(relative): the replay is not the run bit for bit\n",
                                      step_, *out_.lossMaxRelDiff));
    if (out_.gradMaxRelDiff)
      std::cout << (*out_.gradMaxRelDiff == 0
                        ? fmt::format("step {}: the replay's gradients before reduction are the run's, bit for bit "
                                      "({} finite tensors on {} rank{})\n",
                                      step_, out_.gradTensors, out_.gradRanks, out_.gradRanks == 1 ? "" : "s")
                        : fmt::format("step {}: the replay's gradients before reduction differ from the run's by up "
                                      "to {:.3g} (relative; {} finite tensors on {} rank{})\n",
                                      step_, *out_.gradMaxRelDiff, out_.gradTensors, out_.gradRanks,
                                      out_.gradRanks == 1 ? "" : "s"));
    std::cout << "\nverdict: " << out_.verdict;
    if (out_.verdict == "reproducible")
      std::cout << " — the replay makes the value again: a numerical or data problem, not the hardware\n";
    if (out_.verdict == "reproducible" && fromState_)
      std::cout << "  (from the state the step began with: a flipped bit already in that state, finite and not dated "
                   "by the run's replica check, replays the same way; --no-replay-state recomputes the parameters)\n";
    else if (out_.verdict == "transient")
      std::cout << " — the run had a non-finite value at this step, the replay has none: suspect the hardware of "
                << "rank " << rank_ << "\n";
    else
      std::cout << " — no NaN or Inf at this step, in the run or in the replay\n";
    if (const RankResult* r = named(); r != nullptr && r->found) {
      const Json& e = r->evidence;
      std::cout << "first operator: " << r->message << "\n";
      if (!out_.batch.empty()) std::cout << "batch: " << out_.batch << "\n";
      Table t({"input", "kind", "dtype", "shape", "finite", "max |x|", "parameter"}, "rllllrl");
      for (const auto& in : e.value("inputs", Json::array())) {
        if (in.value("kind", "") == "other") continue;  // options, generators, lists: no value to check
        std::string shape;
        if (in.contains("shape")) shape = in["shape"].dump();
        std::string mx = in.contains("max_abs")
                             ? (in["max_abs"].is_string() ? in["max_abs"].get<std::string>()
                                                          : fmt::format("{:.4g}", in["max_abs"].get<double>()))
                             : "";
        t.add({std::to_string(in.value("index", 0)), in.value("kind", ""), in.value("dtype", ""), shape,
               std::string(in.value("finite", true) ? "yes" : "NO") + (in.value("written", false) ? " (written)" : ""),
               mx, in.value("param", "")});
      }
      if (!e.value("inputs", Json::array()).empty()) t.print(std::cout, "  ");
    }
    std::cout << "ranks:\n";
    for (const auto& r : out_.ranks) std::cout << "  " << r.message << "\n";
    if (out_.verdict == "transient") {
      std::cout << "silent-corruption checks on rank " << rank_ << ": "
                << (out_.sdc.empty() ? "none found in the run" : join(out_.sdc, "; ")) << "\n";
    }
    std::cout << "stored in " << file_.string() << " (alert 'replay'); the replay's run: " << out_.replayRun.string()
              << "\n";
  }

  // The verdict into the run file: `diagnose` shows it as a `replay` finding.
  void record() {
    tracedb::AlertRow a;
    a.rank = out_.rank;
    a.step = step_;
    a.kind = std::string(kinds::kReplay);
    a.severity = out_.verdict == "transient" ? "warning" : "info";
    const RankResult* r = named();
    if (r != nullptr && r->found) {
      a.layer = r->evidence.value("layer", -1);
      a.param = r->evidence.value("op", "");
    }
    a.message = out_.verdict == "reproducible" && r != nullptr
                    ? fmt::format("replay of step {}: reproducible — {}", step_, r->message)
                : out_.verdict == "transient"
                    ? fmt::format("replay of step {}: transient — clean on every rank; suspect the hardware of rank {}",
                                  step_, rank_)
                    : fmt::format("replay of step {}: clean", step_);
    a.evidence = toJson().dump();
    // The run file, and the rank's own file beside it (diagnose and merge read a capture folder's rank files).
    std::vector<fs::path> files{file_};
    std::error_code ec;
    if (const fs::path rankFile = file_.parent_path() / fmt::format("rank-{}.db", a.rank);
        file_.filename() == "run.db" && fs::exists(rankFile, ec))
      files.push_back(rankFile);
    for (const fs::path& f : files)
      if (auto s = tracedb::addAlerts(f, std::span<const tracedb::AlertRow>(&a, 1)); !s)
        printError("replay", "the verdict was not stored: " + s.message());
  }

  static std::string rankList(const std::vector<int>& ranks) {
    std::string out;
    for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  }

  static std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
    return out;
  }

  // The program's command resuming from `from` (a checkpoint: its step and folder), or from step 1; to step S.
  void setProgram(const std::optional<std::pair<int, fs::path>>& from) {
    argv_ = program_;
    fromStep_ = from ? from->first + 1 : 1;
    if (from) argv_.insert(argv_.end(), {"--resume", from->second.string()});
    argv_.insert(argv_.end(), {"--stop-after", std::to_string(step_), "--set", "checkpoint_dir=\"\""});
  }

  std::string fromText() const {
    if (fromState_) return fmt::format("the state step {} began from (kept by the run: replay-state)", step_);
    return fromStep_ > 1 ? fmt::format("the checkpoint of step {}", fromStep_ - 1) : std::string("step 1");
  }

  const ReplayArgs& a_;
  fs::path file_;
  std::vector<std::string> program_;  // the run's program, its flags kept but --resume, --stop-after, metrics
  std::optional<std::pair<int, fs::path>> checkpoint_;  // the run's newest checkpoint before S
  bool fromState_ = false;    // the replay runs from the run's replay state of S (the step alone)
  std::string stateHeld_;     // that state already held the value, in this parameter: replayed from before it
  std::string stateSkipped_;  // why the state the run kept was not used ("" where it was, or there was none)
  std::vector<std::string> argv_;
  int world_ = 0, tp_ = 0, dp_ = 0, pp_ = 1;
  int step_ = -1, rank_ = 0;
  int fromStep_ = 1;  // the first step the replay runs (after the checkpoint it resumes from)
  int64_t microBatch_ = 1, gradAccum_ = 1;
  bool zero1_ = false;
  int replica_ = -1;                            // the DP replica replayed alone, or -1: every rank
  int replicaClean_ = -1;  // the replica that replayed clean alone before the whole job ran the step
  std::vector<rules::FaultSpec> faults_;        // the run's --inject faults
  std::vector<std::string> inject_;             // those the replay applies, on its own ranks
  std::vector<tracedb::GradStatRow> runGrads_;  // the run's gradient health of step S
  int captureRc_ = 0;
  analysis::NonFiniteReport nonfinite_;
  std::vector<tracedb::StepStatRow> stepStats_;
  Outcome out_;
};

void addReplay(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<ReplayArgs>();
  auto* cmd = app.add_subcommand("replay",
                                 "The step again, op by op: re-run a tpscope-train run to step S and name the "
                                 "operator that makes the NaN (reproducible or transient)");
  cmd->footer(kHelp);
  cmd->add_option("run", args->run, "Run folder or run file of a capture of tpscope-train")->required();
  cmd->add_option("--step", args->step, "Step to replay (default: the step of the run's NaN/Inf origin)");
  cmd->add_flag("--no-replay-state", args->noState,
                "Ignore the state the run kept for the step (RUN/replay-state): replay from its newest checkpoint, "
                "else from step 1, recomputing the parameters");
  cmd->add_option("--rank", args->rank,
                  "Rank whose DP replica is replayed from the kept state, and named when the replay is clean "
                  "(default: the origin's)");
  cmd->add_option("--hang-timeout", args->hangTimeoutS, "Stop the replay after this long without progress, s")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", args->json,
                "Print JSON: {file, step, rank, verdict, op: {op, pass, span, layer, microbatch, produced, "
                "carrier_input, inputs, ...}, batch, ranks, replayed_ranks, dp_replica, dp_replica_clean, "
                "gradients_at_step, "
                "faults_reapplied, faults_left_out, replay_run}");
  cmd->callback([args, &ctx]() { ctx.exitCode = Replay(*args).run(); });
}

TPS_REGISTER_COMMAND(57, addReplay);

}  // namespace
}  // namespace tpscope::cli
