#include "capture/launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/capture_session.h"
#include "capture/python_program.h"
#include "tpscope/rules/health_rules.h"

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

namespace {

bool isExecutable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

std::optional<int> configInt(const fs::path& config, const char* key) {
  std::ifstream in(config);
  if (!in) return std::nullopt;
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
  return j[key].get<int>();
}

}  // namespace

fs::path resolveProgram(const std::string& name) {
  if (name.empty()) return {};
  if (name.find('/') != std::string::npos) return isExecutable(name) ? fs::path(name) : fs::path();
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    if (!dir.empty() && isExecutable(fs::path(dir) / name)) return fs::path(dir) / name;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return {};
}

fs::path findTrainProgram(const fs::path& self) {
  if (!self.empty()) {
    const fs::path dir = self.parent_path();
    for (const fs::path& p : {dir / "tpscope-train", dir / ".." / "core" / "tpscope-train"})
      if (isExecutable(p)) return fs::weakly_canonical(p);
  }
  return resolveProgram("tpscope-train");
}

// ---- 1. validate ----------------------------------------------------------------------------------------------------
std::optional<int> CaptureSession::validate() {
  if (o_.nproc < 1 || o_.nproc > 4096) return bad(fmt::format("--nproc {} must be between 1 and 4096", o_.nproc));
  if (o_.out.empty()) return bad("--out DIR is required");
  if (!(o_.hangTimeoutS > 0)) return bad(fmt::format("--hang-timeout {} must be > 0 seconds", o_.hangTimeoutS));
  if (auto code = validateNodes()) return code;
  if (auto code = resolveLayout()) return code;
  if (auto code = resolveCommand()) return code;
  return parseFaultsAndHealth();
}

// --nnodes, --node-rank, --master-addr, --master-port, --token: the job's size and this node's place in it.
std::optional<int> CaptureSession::validateNodes() {
  if (o_.nnodes < 1 || o_.nnodes > 4096) return bad(fmt::format("--nnodes {} must be between 1 and 4096", o_.nnodes));
  if (o_.nodeRank < 0 || o_.nodeRank >= o_.nnodes)
    return bad(fmt::format("--node-rank {} must be between 0 and --nnodes - 1 = {}", o_.nodeRank, o_.nnodes - 1));
  world_ = o_.nnodes * o_.nproc;
  firstRank_ = o_.nodeRank * o_.nproc;
  if (world_ > 1'000'000) return bad(fmt::format("--nnodes {} x --nproc {} is too many ranks", o_.nnodes, o_.nproc));
  if (!o_.masterAddr.empty()) masterAddr_ = o_.masterAddr;
  if (o_.masterPort < 0 || o_.masterPort > 65534)
    return bad(fmt::format("--master-port {} must be between 1 and 65534 (port + 1 is the control channel)",
                           o_.masterPort));
  if (o_.nnodes == 1) return std::nullopt;
  if (o_.masterAddr.empty())
    return bad("--nnodes > 1 needs --master-addr HOST: node 0's address, the same on every node");
  if (o_.masterPort == 0) return bad("--nnodes > 1 needs --master-port P, the same on every node");
  if (!(o_.rendezvousTimeoutS > 0))
    return bad(fmt::format("--rendezvous-timeout {} must be > 0 seconds", o_.rendezvousTimeoutS));
  token_ = o_.token;
  if (token_.empty() && o_.nodeRank > 0)
    return bad(fmt::format("node {} needs the job's token: --token T or TPSCOPE_TOKEN=T (the one node 0 prints, or "
                           "one you give every node)",
                           o_.nodeRank));
  if (token_.find_first_of(" \t\n") != std::string::npos) return bad("--token must not contain white space");
  return std::nullopt;
}

std::optional<int> CaptureSession::resolveLayout() {
  tp_ = o_.tp;
  dp_ = o_.dp;
  if (tp_ < 0 || dp_ < 0) return bad("--tp and --dp must be positive");
  if (o_.pp < 1) return bad(fmt::format("--pp {} must be >= 1", o_.pp));
  const std::string ranks = o_.nnodes > 1 ? fmt::format("the job's {} ranks (--nnodes x --nproc)", world_)
                                          : fmt::format("--nproc {}", world_);
  if (world_ % o_.pp != 0) return bad(fmt::format("--pp {} does not divide {}", o_.pp, ranks));
  const int perStage = world_ / o_.pp;
  if (tp_ == 0 && dp_ == 0) dp_ = 1;
  if (tp_ == 0) {
    if (perStage % dp_ != 0) return bad(fmt::format("--dp {} does not divide {} / --pp {}", dp_, ranks, o_.pp));
    tp_ = perStage / dp_;
  } else if (dp_ == 0) {
    if (perStage % tp_ != 0) return bad(fmt::format("--tp {} does not divide {} / --pp {}", tp_, ranks, o_.pp));
    dp_ = perStage / tp_;
  }
  if (tp_ * dp_ * o_.pp != world_)
    return bad(fmt::format("--tp {} x --dp {} x --pp {} = {} ranks, but {}", tp_, dp_, o_.pp, tp_ * dp_ * o_.pp,
                           o_.nnodes > 1 ? ranks : fmt::format("--nproc is {}", world_)));
  return std::nullopt;
}

// The ranks' command line: tpscope-train with the config, or the program after `--`.
std::optional<int> CaptureSession::resolveCommand() {
  defaultProgram_ = o_.program.empty();
  totalSteps_ = o_.steps;
  if (o_.steps && *o_.steps < 1) return bad(fmt::format("--steps {} must be >= 1", *o_.steps));
  if (!defaultProgram_) {
    // The Python program first, while argv names the interpreter as the user wrote it: a bare python3 may become the
    // interpreter tpscope's package was built for.
    argv_ = o_.program;
    std::string pythonError;
    if (!instrumentPythonProgram(argv_, o_.self, &programEnv_, &pythonNote_, &pythonError)) return bad(pythonError);
    const fs::path prog = resolveProgram(argv_.front());
    if (prog.empty()) return bad(fmt::format("program '{}' not found or not executable", argv_.front()));
    argv_.front() = prog.string();
    return std::nullopt;
  }
  if (o_.config.empty()) return bad("--config FILE is required to run tpscope-train (or give -- PROGRAM ARGS...)");
  std::error_code ec;
  if (!fs::is_regular_file(o_.config, ec)) return bad(fmt::format("--config {}: no such file", o_.config.string()));
  const fs::path train = findTrainProgram(o_.self);
  if (train.empty())
    return bad("tpscope-train was not found beside tpscope, in ../core/ or on PATH; give -- PROGRAM ARGS...");
  argv_ = {train.string(), "--config", fs::absolute(o_.config).string(), "--tp", std::to_string(tp_), "--dp",
           std::to_string(dp_)};
  if (o_.steps) argv_.insert(argv_.end(), {"--steps", std::to_string(*o_.steps)});
  if (o_.pp > 1) argv_.insert(argv_.end(), {"--pp", std::to_string(o_.pp)});
  if (!o_.schedule.empty()) argv_.insert(argv_.end(), {"--schedule", o_.schedule});
  if (o_.microbatches) argv_.insert(argv_.end(), {"--microbatches", std::to_string(*o_.microbatches)});
  if (o_.virtualStages) argv_.insert(argv_.end(), {"--virtual-stages", std::to_string(*o_.virtualStages)});
  layers_ = configInt(o_.config, "layers");
  if (!totalSteps_) totalSteps_ = configInt(o_.config, "steps");
  if (!totalSteps_) totalSteps_ = 20;  // tpscope-train's default (docs/config.md)
  return std::nullopt;
}

std::optional<int> CaptureSession::parseFaultsAndHealth() {
  for (const auto& text : o_.inject) {
    std::string error;
    auto spec = rules::parseFaultSpec(text, &error);
    if (!spec) return bad(error);
    if (std::string why = rules::checkFaultSpec(*spec, world_, layers_.value_or(0), o_.pp); !why.empty())
      return bad(why);
    faults_.push_back(*spec);
  }
  if (!o_.onNonfinite.empty()) {
    if (!rules::parseHealthPolicy(o_.onNonfinite))
      return bad(fmt::format("--on-nonfinite {}: expected warn, skip-step, stop or trace-ops", o_.onNonfinite));
    healthText_ = "nonfinite=" + o_.onNonfinite;
  }
  if (!o_.health.empty()) healthText_ += (healthText_.empty() ? "" : ",") + o_.health;
  if (!healthText_.empty()) {
    std::string error;
    if (!rules::parseHealthOptions(healthText_, &error)) return bad(error);
  }
  return std::nullopt;
}

int runCapture(const CaptureOptions& o, std::FILE* out, std::FILE* err, bool tty) {
  CaptureSession session(o, out, err, tty);
  if (auto code = session.validate()) return *code;
  if (auto code = session.prepare()) return *code;
  if (auto code = session.spawn()) return *code;
  session.watch();
  return session.finish();
}

}  // namespace tpscope::cli::capture
