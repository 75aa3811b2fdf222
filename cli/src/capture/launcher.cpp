#include "capture/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/node_link.h"
#include "capture/progress_display.h"
#include "capture/python_program.h"
#include "capture/rank_process.h"
#include "capture/run_poller.h"
#include "capture/stall_watch.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/probes/tcp_store.h"
#include "tpscope/report/findings_text.h"
#include "tpscope/report/html_report.h"
#include "tpscope/rules/fault_spec.h"
#include "tpscope/rules/health_rules.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/rank_file.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/version.h"

extern char** environ;

namespace tpscope::cli::capture {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// ---- signals to the launcher ------------------------------------------------------------------------------------
std::atomic<int> g_interrupts{0};
void onInterrupt(int) { g_interrupts.fetch_add(1, std::memory_order_relaxed); }

class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupts.store(0);
    struct sigaction sa {};
    sa.sa_handler = onInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &oldInt_);
    sigaction(SIGTERM, &sa, &oldTerm_);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &oldPipe_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
    sigaction(SIGPIPE, &oldPipe_, nullptr);
  }

 private:
  struct sigaction oldInt_ {}, oldTerm_ {}, oldPipe_ {};
};

// ---- small helpers -----------------------------------------------------------------------------------------------
int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int64_t unixNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Why files cannot be created in `dir` (read-only file system, no permission); "" when they can. Creating one is
// the only sure test: access(2) answers for the real user id, and root passes permission bits anyway.
std::string writeProblem(const fs::path& dir) {
  const fs::path probe = dir / fmt::format(".tpscope-write-check-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

// The first line in a rank's log where its recorder says it could not start or a flush failed (a full disk, a file
// size limit), without the "tpscope recorder: " prefix; "" when there is none. The recorder logs each distinct
// flush failure once (recorder.cpp), a start failure from startFromEnvironment (environment.cpp).
std::string recorderWriteFailure(const fs::path& log) {
  constexpr std::string_view kPrefix = "tpscope recorder: ";
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(kPrefix)) continue;
    const std::string_view rest = std::string_view(line).substr(kPrefix.size());
    if (rest.starts_with("cannot start: ") || (rest.starts_with("flush to ") && rest.find(" failed: ") != rest.npos))
      return std::string(rest);
  }
  return {};
}

bool isExecutable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

std::string shellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The environment of the ranks: ours, with torchrun's and tpscope's variables replaced.
std::vector<std::string> rankEnvironment(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (!set.contains(key)) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

// Why the run is being stopped, in the order of the exit statuses.
enum class Outcome { Success, BadArgs, Hang, Crash, NonFinite, Interrupted };

int exitCodeOf(Outcome o) {
  switch (o) {
    case Outcome::Success: return kExitSuccess;
    case Outcome::BadArgs: return kExitBadArgs;
    case Outcome::Hang: return kExitHang;
    case Outcome::Crash: return kExitCrash;
    case Outcome::NonFinite: return kExitNonFinite;
    case Outcome::Interrupted: return kExitInterrupted;
  }
  return kExitFailure;
}

// The outcome behind an exit status (another node's stop carries the status).
Outcome outcomeOfStatus(int status) {
  for (Outcome o : {Outcome::Success, Outcome::BadArgs, Outcome::Hang, Outcome::Crash, Outcome::NonFinite,
                    Outcome::Interrupted})
    if (exitCodeOf(o) == status) return o;
  return Outcome::Crash;
}

const char* outcomeName(Outcome o) {
  switch (o) {
    case Outcome::Success: return "success";
    case Outcome::BadArgs: return "bad arguments";
    case Outcome::Hang: return "hang";
    case Outcome::Crash: return "crash";
    case Outcome::NonFinite: return "stopped on non-finite values";
    case Outcome::Interrupted: return "interrupted";
  }
  return "?";
}

// What a rank's own exit status means (tpscope-train: 2 config, 3 collective timeout/failure, 5 non-finite stop).
Outcome outcomeOfRankExit(const ExitStatus& s) {
  if (s.signaled) return Outcome::Crash;
  switch (s.code) {
    case 0: return Outcome::Success;
    case 2: return Outcome::BadArgs;
    case 3: return Outcome::Hang;
    case 5: return Outcome::NonFinite;
    default: return Outcome::Crash;
  }
}

// A rank capture signaled (to dump and stop) that then ended by a signal (or a shell's 128 + signal).
bool endedByOurSignal(const ExitStatus& s, bool stoppedByCapture) {
  return stoppedByCapture && (s.signaled || s.code >= 128);
}

// ranks.exit_reason as the launcher saw it. The prefix matters: the crash analysis takes "crash..." as a crash and
// "stopped by ..." as not one, whatever signal the text names (analysis/crash.h).
// A rank capture signalled counts as stopped by capture only if a signal ended it (the recorder re-raises SIGTERM
// after its dump); one that exited with a status of its own ended on its own terms.
// The line of a rank's log that says why it died: the last one naming an error or exception ("ModuleNotFoundError:
// No module named 'torch'", "terminate called after ..."), else the last non-empty line; "" for an empty log.
std::string lastErrorLine(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 64 * 1024);
  in.seekg(from);
  std::string line, lastError, lastLine;
  if (from > 0) std::getline(in, line);  // a partial first line
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    lastLine = line;
    if (line.find("rror") != std::string::npos || line.find("xception") != std::string::npos ||
        line.find("terminate called") != std::string::npos || line.find("FATAL") != std::string::npos)
      lastError = line;
  }
  std::string out = lastError.empty() ? lastLine : lastError;
  if (out.size() > 300) out = out.substr(0, 297) + "...";
  return out;
}

std::string rankExitReason(const ExitStatus& s, bool stoppedByCapture, const std::string& stopWhy) {
  if (endedByOurSignal(s, stoppedByCapture)) return fmt::format("stopped by capture ({})", stopWhy);
  if (s.ok()) return "ok";
  switch (outcomeOfRankExit(s)) {
    case Outcome::BadArgs: return fmt::format("bad config or arguments: {}", s.describe());
    case Outcome::Hang: return fmt::format("collective timeout or failure: {}", s.describe());
    case Outcome::NonFinite: return fmt::format("stopped on non-finite values: {}", s.describe());
    default: return fmt::format("crash: {}", s.describe());
  }
}

// The shared layout of findings and alerts (report/findings_text.h); capture prints them one by one.
std::string formatFinding(const analysis::Finding& f, const std::map<int, tracedb::RankInfo>& /*ranks*/) {
  return report::findingText(f);  // the message names the rank and its place where it matters
}

std::optional<int> configInt(const fs::path& config, const char* key) {
  std::ifstream in(config);
  if (!in) return std::nullopt;
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
  return j[key].get<int>();
}

// --html: the same writer as `tpscope report RUN --html FILE`. Returns false (after one error line) on failure.
bool writeHtmlReport(tracedb::Reader& run, const fs::path& file, std::FILE* out, std::FILE* err) {
  report::HtmlReportOptions options;
  options.generator = "tpscope " TPSCOPE_VERSION;
  auto page = report::renderHtmlReport(run, options);
  tracedb::Status s = page ? report::writeHtmlFile(file, page->html) : page.status();
  if (!s) {
    fmt::print(err, "tpscope capture: error: HTML report: {}\n", s.message());
    return false;
  }
  fmt::print(out, "HTML report → {}\n", file.string());
  return true;
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

namespace {

// ---- the capture session -----------------------------------------------------------------------------------------
// One capture in the order runCapture runs it (launcher.h, "Lifecycle"): validate → prepare → spawn → watch →
// finish. A step that ends the capture early returns its exit status; std::nullopt means "go on".
class CaptureSession {
 public:
  CaptureSession(const CaptureOptions& o, std::FILE* out, std::FILE* err, bool tty)
      : o_(o), out_(out), err_(err), tty_(tty) {}

  std::optional<int> validate();
  std::optional<int> prepare();
  std::optional<int> spawn();
  void watch();
  int finish();

 private:
  enum class Stop { None, Dumping, Terminating, Killing };

  int bad(const std::string& why) const {
    fmt::print(err_, "tpscope capture: error: {}\n", why);
    return kExitBadArgs;
  }
  // validate
  std::optional<int> validateNodes();
  std::optional<int> resolveLayout();
  std::optional<int> resolveCommand();
  std::optional<int> parseFaultsAndHealth();
  // prepare
  std::optional<int> prepareFolder();
  std::optional<int> startStoreAndAnnounce();
  std::optional<int> connectNodes();
  void raiseOpenFileLimit(const probes::TcpKvLimits& limits);
  bool ownsRankFile(const std::string& name) const;
  // watch
  bool reapRanks();  // false once no rank runs
  void reportEndedRank(const RankProcess& p);
  void handleInterrupts();
  void pollProgress();
  void advanceStop();
  void beginStop(Outcome why, const std::string& whyText, const std::string& message);
  void showNewAlerts();
  void pollNodes();
  static double secondsSince(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  // finish
  void checkRecorderWrites();
  std::vector<std::pair<std::string, std::string>> recordRankExits();
  std::optional<int> mergeRankFiles(const std::vector<std::pair<std::string, std::string>>& meta);
  void diagnose();
  void finishNodes();
  void reportStrangers();
  fs::path logOf(int rank) const { return logs_ / fmt::format("rank-{}.log", rank); }
  size_t slot(int rank) const { return static_cast<size_t>(rank - firstRank_); }  // this node's index of a rank

  const CaptureOptions& o_;
  std::FILE* out_;
  std::FILE* err_;
  bool tty_;
  // validate
  int world_ = 0, firstRank_ = 0;  // ranks in the job; this node's first global rank
  int tp_ = 0, dp_ = 0;
  bool defaultProgram_ = false;
  std::vector<std::string> argv_;
  std::optional<int> layers_, totalSteps_;
  std::vector<rules::FaultSpec> faults_;
  std::string healthText_;
  std::map<std::string, std::string> programEnv_;  // a Python program: PYTHONPATH with the tpscope package
  std::string pythonNote_;
  // prepare
  fs::path dir_, logs_, runFile_;
  std::unique_ptr<probes::TcpKvServer> store_;
  std::unique_ptr<NodeLink> link_;          // several nodes: the control channel (node_link.h)
  std::string masterAddr_ = "127.0.0.1", storeAddr_, token_;
  int masterPort_ = 0;
  int64_t epochNs_ = 0;
  std::string runId_, command_;
  // spawn, watch
  std::optional<InterruptGuard> interrupts_;
  std::vector<RankProcess> ranks_;
  std::optional<RunPoller> poller_;
  std::optional<ProgressDisplay> display_;
  std::optional<StallWatch> stalls_;
  Clock::time_point lastProgress_{}, lastPoll_{}, stopAt_{};
  std::optional<Outcome> outcome_;  // first abnormal event decides
  std::string stopWhy_;             // for the stopped ranks' exit reason
  bool remoteStop_ = false;         // another node stopped the job (not posted again)
  Stop stop_ = Stop::None;
  std::vector<bool> signaled_;
  std::vector<bool> echoed_;  // ended on its own after the stop began: an echo of the first cause, not a cause
  int interruptsSeen_ = 0;
  // finish
  int code_ = kExitSuccess;
  std::string outcomeText_;
  bool traceIncomplete_ = false;
  std::vector<int> missingRanks_;  // ranks that left no rank file
};

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
      return bad(fmt::format("--on-nonfinite {}: expected warn, skip-step or stop", o_.onNonfinite));
    healthText_ = "nonfinite=" + o_.onNonfinite;
  }
  if (!o_.health.empty()) healthText_ += (healthText_.empty() ? "" : ",") + o_.health;
  if (!healthText_.empty()) {
    std::string error;
    if (!rules::parseHealthOptions(healthText_, &error)) return bad(error);
  }
  return std::nullopt;
}

// ---- 2. prepare the folder, the store, the port -----------------------------------------------------------------
std::optional<int> CaptureSession::prepare() {
  if (auto code = prepareFolder()) return code;
  return startStoreAndAnnounce();
}

// Creates DIR and DIR/logs and removes the previous capture's rank files, run file and rank logs (nothing else).
std::optional<int> CaptureSession::prepareFolder() {
  std::error_code ec;
  fs::create_directories(o_.out, ec);
  if (ec || !fs::is_directory(o_.out))
    return bad(fmt::format("--out {}: cannot create the folder: {}", o_.out.string(),
                           ec ? ec.message() : "not a folder"));
  dir_ = fs::absolute(o_.out);
  runFile_ = dir_ / "run.db";
  // Refused before anything in it is removed or any rank starts (a read-only folder, no permission).
  if (std::string why = writeProblem(dir_); !why.empty())
    return bad(fmt::format("--out {}: cannot write in this folder: {}", o_.out.string(), why));
  logs_ = dir_ / "logs";
  fs::create_directories(logs_, ec);
  if (ec || !fs::is_directory(logs_))
    return bad(fmt::format("--out {}: cannot create {}: {}", o_.out.string(), logs_.string(),
                           ec ? ec.message() : "not a folder"));
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const bool rankFile = name.starts_with("rank-") && (name.ends_with(".db") || name.ends_with(".db-wal") ||
                                                        name.ends_with(".db-shm") || name.ends_with(".db-journal"));
    const bool runFile = name == "run.db" || name == "run.db-wal" || name == "run.db-shm";
    if ((rankFile && ownsRankFile(name)) || runFile) removed += fs::remove(entry.path(), ec) ? 1 : 0;
  }
  for (const auto& entry : fs::directory_iterator(logs_, ec))
    if (const std::string name = entry.path().filename().string(); name.starts_with("rank-") && ownsRankFile(name))
      fs::remove(entry.path(), ec);
  if (removed > 0) fmt::print(out_, "replacing the previous capture in {}\n", dir_.string());
  return std::nullopt;
}

// One node: a capture folder holds every rank file of the run. Several: only this node's ranks are its to replace
// (a folder shared by mistake keeps the other nodes' files).
bool CaptureSession::ownsRankFile(const std::string& name) const {
  if (o_.nnodes == 1) return true;
  int rank = -1;
  const char* begin = name.data() + 5;  // after "rank-"
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), rank);
  return ec == std::errc() && end != begin && *end == '.' && rank >= firstRank_ && rank < firstRank_ + o_.nproc;
}

// The clock store and MASTER_PORT on loopback, the run's id and epoch; prints what is about to run.
std::optional<int> CaptureSession::startStoreAndAnnounce() {
  epochNs_ = unixNowNs();
  runId_ = fmt::format("{}-{}-{}", dir_.filename().string(), epochNs_ / 1'000'000'000, ::getpid());
  masterPort_ = o_.masterPort;
  if (o_.nodeRank == 0) raiseOpenFileLimit(storeLimits(world_, o_.nnodes));
  if (o_.nnodes > 1) {
    if (auto code = connectNodes()) return code;
  } else {
    // A token on loopback too: other users of this machine can reach 127.0.0.1. The ranks get it (TPSCOPE_TOKEN).
    token_ = o_.token.empty() ? makeToken() : o_.token;
    std::string storeError;
    store_ = probes::TcpKvServer::listen("127.0.0.1", 0, &storeError, token_, storeLimits(world_, 1));
    if (!store_) {
      fmt::print(err_, "tpscope capture: error: cannot start the clock store on loopback: {}\n", storeError);
      return kExitFailure;
    }
    storeAddr_ = fmt::format("127.0.0.1:{}", store_->port());
    if (masterPort_ == 0) masterPort_ = freeLoopbackPort();
    if (masterPort_ == 0) {
      fmt::print(err_, "tpscope capture: error: no free loopback port for MASTER_PORT\n");
      return kExitFailure;
    }
  }

  for (const auto& a : argv_) command_ += (command_.empty() ? "" : " ") + shellQuote(a);
  const std::string pp = o_.pp > 1 ? fmt::format(" x pp {}", o_.pp) : "";
  if (o_.nnodes > 1)
    fmt::print(out_, "capture: node {} of {}: ranks {}-{} of {} (tp {} x dp {}{}) → {}\n  {}\n", o_.nodeRank,
               o_.nnodes, firstRank_, firstRank_ + o_.nproc - 1, world_, tp_, dp_, pp, dir_.string(), command_);
  else
    fmt::print(out_, "capture: {} ranks (tp {} x dp {}{}) → {}\n  {}\n", o_.nproc, tp_, dp_, pp, dir_.string(),
               command_);
  if (!faults_.empty()) fmt::print(out_, "  inject: {}\n", rules::formatFaultList(faults_));
  if (!healthText_.empty()) fmt::print(out_, "  health: {}\n", healthText_);
  if (!pythonNote_.empty()) fmt::print(out_, "  python: {}\n", pythonNote_);
  std::fflush(out_);
  return std::nullopt;
}

// Several nodes: node 0 serves the control channel and publishes the job (run id, time origin, layout); the others
// connect with the token, say hello and take the job's run id and time origin. Nothing is started before every node
// is in (bounded by --rendezvous-timeout).
std::optional<int> CaptureSession::connectNodes() {
  NodeLink::Options lo;
  lo.nnodes = o_.nnodes;
  lo.nodeRank = o_.nodeRank;
  lo.masterAddr = masterAddr_;
  lo.controlPort = o_.masterPort + 1;
  lo.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(o_.rendezvousTimeoutS * 1000));
  lo.storeLimits = storeLimits(world_, o_.nnodes);
  if (token_.empty()) {
    token_ = makeToken();
    fmt::print(out_, "capture: the job's token is {} — give it to the other nodes (--token or TPSCOPE_TOKEN)\n",
               token_);
  }
  lo.token = token_;
  std::string error;
  bool refused = false;
  link_ = NodeLink::open(lo, &error, &refused);
  if (!link_) {
    fmt::print(err_, "tpscope capture: error: {}\n", error);
    return refused ? kExitBadArgs : kExitFailure;
  }
  storeAddr_ = link_->storeAddress();
  if (o_.nodeRank == 0) {
    fmt::print(out_, "capture: node 0 of {}: waiting for the other nodes on {} (at most {:g} s: "
                     "--rendezvous-timeout)\n",
               o_.nnodes, storeAddr_, o_.rendezvousTimeoutS);
    std::fflush(out_);
    if (!link_->waitForNodesAndPublish(JobInfo{runId_, epochNs_, o_.nproc, world_}, &error)) {
      fmt::print(err_, "tpscope capture: error: {}\n", error);
      return kExitFailure;
    }
    return std::nullopt;
  }
  const char* hostEnv = std::getenv("TPSCOPE_HOSTNAME");
  char host[256] = {};
  if (hostEnv != nullptr && *hostEnv != '\0') std::snprintf(host, sizeof host, "%s", hostEnv);
  else ::gethostname(host, sizeof host - 1);
  const auto job = link_->helloAndReadJob(host, &error);
  if (!job) {
    fmt::print(err_, "tpscope capture: error: {}\n", error);
    return kExitFailure;
  }
  if (job->worldSize != world_ || job->nprocPerNode != o_.nproc) {
    const std::string why = fmt::format("node {} has --nproc {} ({} ranks in all) but node 0 has --nproc {} ({} ranks)",
                                        o_.nodeRank, o_.nproc, world_, job->nprocPerNode, job->worldSize);
    link_->claimStop(kExitBadArgs, why);
    link_->postDone(kExitBadArgs);  // node 0 need not wait for this node's ranks: there are none
    return bad(why);
  }
  runId_ = job->runId;
  epochNs_ = job->epochNs;
  return std::nullopt;
}

// The store holds a descriptor per rank and node capture of the job (storeLimits()) plus the strangers it tolerates,
// and the poller a few per local rank: the soft open-file limit (often 1024) is raised to what the job needs, up to
// the hard limit. Below that, a warning: the ranks past it would run with unaligned clocks.
void CaptureSession::raiseOpenFileLimit(const probes::TcpKvLimits& limits) {
  const auto need = static_cast<rlim_t>(limits.maxClients + limits.maxPending + 4 * static_cast<size_t>(o_.nproc) + 64);
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
  if (::setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= need) return;
  fmt::print(err_, "tpscope capture: warning: the open-file limit ({}) is below the {} descriptors the clock store "
                   "of {} ranks needs; ranks past it run with unaligned clocks (raise it: ulimit -n)\n",
             rl.rlim_cur, need, world_);
}

// ---- 3. spawn -------------------------------------------------------------------------------------------------------
std::optional<int> CaptureSession::spawn() {
  interrupts_.emplace();
  for (int local = 0; local < o_.nproc; ++local) {
    const int r = firstRank_ + local;
    std::map<std::string, std::string> set = {
        {"MASTER_ADDR", masterAddr_},
        {"MASTER_PORT", std::to_string(masterPort_)},
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(world_)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc)},
        {"GROUP_RANK", std::to_string(o_.nodeRank)},
        {"TPSCOPE_OUT", dir_.string()},
        {"TPSCOPE_RUN_ID", runId_},
        {"TPSCOPE_EPOCH_NS", std::to_string(epochNs_)},
        {"TPSCOPE_CLOCK_STORE", storeAddr_},
        {"TPSCOPE_INJECT", rules::formatFaultList(faults_)},
        {"TPSCOPE_HEALTH", healthText_},
        {"TPSCOPE_TP", std::to_string(tp_)},
        {"TPSCOPE_DP", std::to_string(dp_)},
        {"TPSCOPE_PP", std::to_string(o_.pp)},
    };
    if (!token_.empty()) set["TPSCOPE_TOKEN"] = token_;
    set.insert(programEnv_.begin(), programEnv_.end());
    if (std::getenv("OMP_NUM_THREADS") == nullptr) set["OMP_NUM_THREADS"] = "1";
    std::string error;
    auto p = RankProcess::spawn(r, argv_, rankEnvironment(set), logOf(r), &error);
    if (!p) {
      for (auto& q : ranks_) q.signal(SIGKILL);
      for (auto& q : ranks_)
        while (!q.poll() && q.running()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (link_) {  // the other nodes' ranks would wait for this node's at their rendezvous
        link_->claimStop(kExitBadArgs, fmt::format("node {}: rank {} could not start: {}", o_.nodeRank, r, error));
        link_->postDone(kExitBadArgs);
      }
      return bad(fmt::format("rank {}: {}", r, error));
    }
    ranks_.push_back(std::move(*p));
  }
  return std::nullopt;
}

// ---- 4. watch -------------------------------------------------------------------------------------------------------
// Until every rank has ended: reap, react to Ctrl-C, poll progress and alerts (the hang watchdog), run the stop
// sequence.
void CaptureSession::watch() {
  poller_.emplace(dir_, o_.nproc, firstRank_);
  display_.emplace(out_, tty_);
  stalls_.emplace(o_.stallAfterS);
  lastProgress_ = Clock::now();
  lastPoll_ = lastProgress_ - std::chrono::hours(1);
  signaled_.assign(static_cast<size_t>(o_.nproc), false);
  echoed_.assign(static_cast<size_t>(o_.nproc), false);
  while (reapRanks()) {
    handleInterrupts();
    if (Clock::now() - lastPoll_ >= std::chrono::milliseconds(o_.pollMs)) {
      pollProgress();
      pollNodes();
    }
    advanceStop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  showNewAlerts();  // one last look for alerts written at the very end
  for (const std::string& l : stalls_->desyncsAfterEnd(*poller_)) display_->message(l);  // ranks that died on one
  display_->finish();
  poller_->close();
}

void CaptureSession::beginStop(Outcome why, const std::string& whyText, const std::string& message) {
  if (stop_ != Stop::None) {
    if (!outcome_) outcome_ = why;
    return;
  }
  stopWhy_ = whyText;
  std::string shown = message;
  // Several nodes: the job's first abnormal event is the first stop claimed on the control channel, whichever node
  // saw it. When another node's claim came first, its cause is the job's (ours is likely its echo).
  if (link_ && !remoteStop_) {
    const auto first = link_->claimStop(exitCodeOf(why), fmt::format("node {}: {}", o_.nodeRank, whyText));
    if (first && first->node != o_.nodeRank) {
      remoteStop_ = true;
      why = outcomeOfStatus(first->exitStatus);
      stopWhy_ = first->why;
      shown += fmt::format("\n  node {} stopped the job first ({}): that is the cause", first->node, first->why);
    }
  }
  if (!outcome_) outcome_ = why;
  display_->message(shown);
  stop_ = Stop::Dumping;
  stopAt_ = Clock::now();
  for (auto& p : ranks_) {
    if (!p.running()) continue;
    p.signal(SIGUSR1);
    signaled_[slot(p.rank())] = true;
  }
}

// Reaps the ranks that ended. When several are found ended in one look, the likeliest first cause goes first: a rank
// killed by a signal, then one failing on its own with an error status (often a peer lost outside a collective: a
// store read, a group being built), then one whose collective failed because a peer was gone.
bool CaptureSession::reapRanks() {
  std::vector<RankProcess*> ended;
  for (auto& p : ranks_)
    if (p.poll()) ended.push_back(&p);
  // A collective that failed (exit 3) is most often a peer's echo: a rank leaving on an error closes its Gloo
  // connections while it unwinds, before its own exit is seen. Give the cause a moment to end too.
  auto collectiveFailure = [this](const RankProcess* p) {
    return !signaled_[slot(p->rank())] && outcomeOfRankExit(*p->status()) == Outcome::Hang;
  };
  if (stop_ == Stop::None && !ended.empty() && std::all_of(ended.begin(), ended.end(), collectiveFailure)) {
    for (const auto until = Clock::now() + std::chrono::milliseconds(1000); Clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool other = false;
      for (auto& p : ranks_)
        if (p.poll()) {  // true only for a rank that ended in this call
          ended.push_back(&p);
          other |= !collectiveFailure(&p);
        }
      if (other) break;
    }
  }
  auto causeRank = [](const RankProcess* p) {
    if (p->status()->signaled) return 0;
    switch (outcomeOfRankExit(*p->status())) {
      case Outcome::Crash: return 1;
      case Outcome::NonFinite: return 2;
      case Outcome::BadArgs: return 3;
      default: return 4;
    }
  };
  std::stable_sort(ended.begin(), ended.end(),
                   [&](const RankProcess* a, const RankProcess* b) { return causeRank(a) < causeRank(b); });
  for (const RankProcess* p : ended) reportEndedRank(*p);
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankProcess& p) { return p.running(); });
}

// A rank that failed on its own (not stopped by us): say so with its log's last lines and stop the others.
void CaptureSession::reportEndedRank(const RankProcess& p) {
  const ExitStatus& s = *p.status();
  if (s.ok()) return;
  const Outcome oc = outcomeOfRankExit(s);
  // The job is already stopping on an earlier rank's end and this one dies too (an error status, Gloo taking the
  // process down): it went down with the first cause, its peer gone — also when our dump request reached it first
  // (a rank still in its rendezvous loses the store with rank 0 and exits 1). A status of its own (3, 5) keeps its
  // reason.
  if (stop_ != Stop::None && oc == Outcome::Crash) echoed_[slot(p.rank())] = true;
  if (signaled_[slot(p.rank())]) return;
  // Several nodes: a rank that fails is often the echo of a peer lost on another node (its collective fails, or
  // Gloo takes the process down). The node that saw the cause gets a moment to claim the stop first; every node
  // waits the same, so the first to see a failure is the first to claim.
  for (const auto until = Clock::now() + std::chrono::milliseconds(1500);
       link_ && stop_ == Stop::None && Clock::now() < until;) {
    pollNodes();
    if (stop_ == Stop::None) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string msg = fmt::format("rank {} (pid {}) ended: {}", p.rank(), p.pid(), s.describe());
  if (oc == Outcome::Hang) msg += " (collective timeout or failure)";
  if (oc == Outcome::NonFinite) msg += " (stopped on non-finite values)";
  if (oc == Outcome::BadArgs) msg += " (refused its arguments or config)";
  const std::string tail = tailOfFile(logOf(p.rank()), 8);
  if (!tail.empty()) {
    msg += fmt::format("\n  last lines of {}:", logOf(p.rank()).string());
    std::string_view t = tail;
    while (!t.empty()) {
      const size_t nl = t.find('\n');
      msg += "\n    " + std::string(t.substr(0, nl));
      if (nl == std::string_view::npos) break;
      t.remove_prefix(nl + 1);
    }
  }
  bool others = false;
  for (auto& q : ranks_) others |= q.running();
  if (others && stop_ == Stop::None) msg += "\n  dumping and stopping the other ranks";
  const std::string how = s.signaled ? "by " + signalName(s.signal) : s.describe();
  beginStop(oc, fmt::format("after rank {} ended: {}", p.rank(), how), msg);
}

// Ctrl-C / SIGTERM to capture: the first one dumps and stops the ranks, a second one kills them at once.
void CaptureSession::handleInterrupts() {
  const int interruptsNow = g_interrupts.load(std::memory_order_relaxed);
  if (interruptsNow <= interruptsSeen_) return;
  if (stop_ == Stop::None) {
    beginStop(Outcome::Interrupted, "interrupted", "interrupted — dumping all ranks (again to kill them now)");
    outcome_ = Outcome::Interrupted;
  } else if (interruptsSeen_ > 0 || stop_ != Stop::Dumping) {
    for (auto& p : ranks_) p.signal(SIGKILL);
    stop_ = Stop::Killing;
  }
  interruptsSeen_ = interruptsNow;
}

void CaptureSession::showNewAlerts() {
  std::vector<LiveAlert> alerts;
  if (poller_->poll(&alerts)) lastProgress_ = lastPoll_;
  for (const auto& a : alerts) display_->message(liveAlertText(a));
}

// Several nodes: another node's stop (its watchdog, a failed rank, Ctrl-C there) or the loss of node 0 stops this
// node's ranks too, with the same exit status.
void CaptureSession::pollNodes() {
  if (!link_ || stop_ != Stop::None) return;
  bool lost = false;
  const std::optional<RemoteStop> stop = link_->pollStop(&lost);
  if (stop) {
    remoteStop_ = true;
    beginStop(outcomeOfStatus(stop->exitStatus), stop->why, fmt::format("node {} stopped the job ({}) — dumping and stopping this node's ranks",
                                          stop->node, stop->why));
  } else if (lost) {
    remoteStop_ = true;
    beginStop(Outcome::Crash, "lost the control channel to node 0",
              "lost the control channel to node 0 (its capture or machine is gone) — dumping and stopping this "
              "node's ranks");
  }
}

// Progress, alerts, watchdog.
void CaptureSession::pollProgress() {
  lastPoll_ = Clock::now();
  showNewAlerts();
  ProgressLine line;
  line.step = poller_->completedStep();
  line.totalSteps = totalSteps_.value_or(0);
  const RankProgress& r0 = poller_->rank(0);
  if (r0.lastStep > 0) {
    line.loss = r0.lastLoss;
    line.haveLoss = true;
    if (r0.meanStepNs > 0) {
      line.tokensPerS = static_cast<double>(r0.tokens) * dp_ / (r0.meanStepNs * 1e-9);
      if (line.totalSteps > 0) line.etaS = (line.totalSteps - line.step) * r0.meanStepNs * 1e-9;
    }
  }
  if (line.step > 0) display_->update(line);
  if (stop_ == Stop::None) {
    std::vector<bool> exited;
    for (const auto& p : ranks_) exited.push_back(!p.running());
    for (const std::string& l : stalls_->update(*poller_, exited, poller_->completedStep() < 1)) display_->message(l);
  } else {
    for (const std::string& l : stalls_->desyncsAfterEnd(*poller_)) display_->message(l);  // e.g. Gloo aborted on it
  }
  // Until every rank has finished a step (rendezvous, model build, first step), allow at least the startup time.
  const double limit = poller_->watchdogLimitS(o_.hangTimeoutS, o_.startupTimeoutS);
  if (stop_ == Stop::None && secondsSince(lastProgress_) > limit)
    beginStop(Outcome::Hang, fmt::format("hang watchdog: no progress for {:g} s", limit),
              fmt::format("no progress for {:g} s — dumping all ranks", limit));
}

// The stop sequence: SIGUSR1 (dump) → dumpWaitS → SIGTERM → termGraceS → SIGKILL.
void CaptureSession::advanceStop() {
  if (stop_ == Stop::Dumping && secondsSince(stopAt_) >= o_.dumpWaitS) {
    for (auto& p : ranks_) p.signal(SIGTERM);
    stop_ = Stop::Terminating;
    stopAt_ = Clock::now();
  } else if (stop_ == Stop::Terminating && secondsSince(stopAt_) >= o_.termGraceS) {
    for (auto& p : ranks_) {
      if (p.running()) display_->message(fmt::format("rank {} did not exit after SIGTERM — SIGKILL", p.rank()));
      p.signal(SIGKILL);
    }
    stop_ = Stop::Killing;
    stopAt_ = Clock::now();
  }
}

// ---- 5. mark, merge, diagnose -----------------------------------------------------------------------------------
int CaptureSession::finish() {
  const Outcome finalOutcome = outcome_.value_or(Outcome::Success);
  code_ = exitCodeOf(finalOutcome);
  outcomeText_ = outcomeName(finalOutcome);
  checkRecorderWrites();
  finishNodes();
  const auto meta = recordRankExits();
  reportStrangers();
  store_.reset();
  link_.reset();
  if (auto code = mergeRankFiles(meta)) return *code;
  if (o_.nnodes > 1)
    fmt::print(out_, "diagnosis of node {}'s ranks alone (a hang elsewhere shows here as ranks waiting on peers):\n",
               o_.nodeRank);
  diagnose();
  if (o_.nnodes > 1)
    fmt::print(out_, "{} holds node {}'s ranks; the whole job: tpscope merge {} <the other nodes' folders> -o run.db\n",
               runFile_.string(), o_.nodeRank, dir_.string());
  if (code_ == kExitSuccess)
    fmt::print(out_, "exit status 0 (success); every rank's records are in {}\n", runFile_.string());
  else
    fmt::print(out_, "exit status {} ({}); {} records are in {}\n", code_, outcomeText_,
               traceIncomplete_ ? "what the ranks could write of their" : "every rank's", runFile_.string());
  std::fflush(out_);
  return code_;
}

// Connections this node's store dropped or turned away (node 0, or a single node). The job's own clients log in at
// once and stay within the limits, so any count is someone else's doing, or a job larger than the store was sized
// for: worth a line either way.
void CaptureSession::reportStrangers() {
  std::optional<probes::TcpKvServerStats> s;
  if (store_) {
    s = store_->stats();
  } else if (link_) {
    s = link_->storeStats();
  }
  if (!s) return;
  const uint64_t strangers = s->loginTimeouts + s->evictedPending + s->malformed + s->wrongTokens;
  if (strangers > 0)
    fmt::print(out_, "capture: the store dropped {} connection{} that did not log in with the job's token ({} silent "
                     "past the login deadline, {} pushed out by newer ones, {} with a wrong token, {} malformed)\n",
               strangers, strangers == 1 ? "" : "s", s->loginTimeouts, s->evictedPending, s->wrongTokens,
               s->malformed);
  if (const uint64_t dropped = s->stalledRequests + s->unreadReplies; dropped > 0)
    fmt::print(out_, "capture: the store dropped {} logged-in client{} that stalled (a request half-sent for {:g} s, "
                     "or replies left unread)\n",
               dropped, dropped == 1 ? "" : "s", storeLimits(world_, o_.nnodes).requestTimeout.count() / 1000.0);
  if (s->refusedFull > 0)
    fmt::print(out_, "capture: the store turned away {} client{} with the job's token: it admits {} at once\n",
               s->refusedFull, s->refusedFull == 1 ? "" : "s", storeLimits(world_, o_.nnodes).maxClients);
  std::fflush(out_);
}

// Several nodes: says this node's ranks have ended. Node 0 waits for the others (its store is their control channel
// and clock store). A node whose own ranks all succeeded takes the job's failure from another node.
void CaptureSession::finishNodes() {
  if (!link_) return;
  link_->postDone(code_);
  std::map<int, int> done;
  if (o_.nodeRank == 0) {
    const double waitS = o_.dumpWaitS + o_.termGraceS + 30;
    fmt::print(out_, "waiting (at most {:g} s) for the other nodes' ranks to end\n", waitS);
    std::fflush(out_);
    done = link_->waitForDone(std::chrono::milliseconds(static_cast<int64_t>(waitS * 1000)));
    for (int k = 1; k < o_.nnodes; ++k)
      if (!done.contains(k)) fmt::print(err_, "tpscope capture: warning: node {} did not report its end\n", k);
  }
  if (code_ != kExitSuccess) return;
  bool lost = false;
  if (const auto stop = link_->pollStop(&lost)) {
    code_ = stop->exitStatus;
    outcomeText_ = fmt::format("stopped by node {}: {}", stop->node, stop->why);
    return;
  }
  for (const auto& [node, status] : done)
    if (status != kExitSuccess) {
      code_ = status;
      outcomeText_ = fmt::format("node {} ended with exit status {}", node, status);
      return;
    }
}

// A rank whose recorder could not write (a full disk, a file size limit) trained on, but its trace has holes: that
// is said, and a run that otherwise succeeded ends with kExitFailure.
void CaptureSession::checkRecorderWrites() {
  for (auto& p : ranks_) {
    const fs::path log = logOf(p.rank());
    if (std::string why = recorderWriteFailure(log); !why.empty()) {
      fmt::print(err_, "tpscope capture: error: rank {}'s trace is incomplete: {} (see {})\n", p.rank(), why,
                 log.string());
      traceIncomplete_ = true;
      if (code_ == kExitSuccess) {
        code_ = kExitFailure;
        outcomeText_ = "incomplete trace";
      }
    }
  }
}

// Writes the launcher's view of each rank's end into its rank file (where it knows more than the rank) and returns
// the capture_* meta keys of the run file.
std::vector<std::pair<std::string, std::string>> CaptureSession::recordRankExits() {
  std::vector<std::pair<std::string, std::string>> meta = {
      {"capture_outcome", outcomeText_},
      {"capture_exit_status", std::to_string(code_)},
      {"capture_command", command_},
      {"capture_inject", rules::formatFaultList(faults_)},
      {"capture_health", healthText_},
      {"capture_hang_timeout_s", fmt::format("{:g}", o_.hangTimeoutS)},
  };
  if (o_.nnodes > 1) {
    meta.emplace_back("capture_nnodes", std::to_string(o_.nnodes));
    meta.emplace_back("capture_node_rank", std::to_string(o_.nodeRank));
  }
  std::error_code ec;
  for (auto& p : ranks_) {
    const fs::path file = dir_ / fmt::format("rank-{}.db", p.rank());
    const ExitStatus& s = *p.status();
    const bool ours = signaled_[slot(p.rank())];
    meta.emplace_back(fmt::format("capture_rank_exit:{}", p.rank()),
                      s.describe() + (ours && (s.signaled || s.code >= 128) ? " (stopped by capture)" : ""));
    if (!fs::exists(file, ec)) {
      missingRanks_.push_back(p.rank());
      continue;
    }
    if (s.ok()) continue;  // the rank said "ok" itself
    // Another node's failure was the job's first cause, or this rank ended on its own after the first cause here
    // began the stop: it went down with that cause (its peer gone), and is no cause of its own. A rank our stop
    // signal ended is the stop's, whatever the cause.
    const bool echo = !endedByOurSignal(s, ours) && ((!ours && remoteStop_) || echoed_[slot(p.rank())]);
    const std::string reason =
        echo ? fmt::format("stopped by the job's stop ({}); it ended first: {}", stopWhy_, s.describe())
             : rankExitReason(s, ours, stopWhy_);
    if (tracedb::Status e = tracedb::markRankExit(file, reason, s.describe()); !e)
      fmt::print(err_, "tpscope capture: warning: cannot record rank {}'s exit: {}\n", p.rank(), e.message());
  }
  return meta;
}

// DIR/rank-*.db → DIR/run.db with the capture_* meta keys. Returns the exit status when there is nothing to diagnose.
std::optional<int> CaptureSession::mergeRankFiles(const std::vector<std::pair<std::string, std::string>>& meta) {
  auto files = tracedb::rankFiles(dir_);
  std::erase_if(files, [this](const fs::path& f) { return !ownsRankFile(f.filename().string()); });
  if (files.empty()) {
    // The first rank whose log says why it died: that line is the answer, not a guess about the program.
    std::string quoted;
    for (const auto& p : ranks_) {
      if (std::string line = lastErrorLine(logOf(p.rank())); !line.empty()) {
        quoted = fmt::format(": rank {} died before recording; its log ({}) ends with: {}", p.rank(),
                             logOf(p.rank()).string(), line);
        break;
      }
    }
    fmt::print(err_, "tpscope capture: error: no rank wrote a trace file in {}{}\n", dir_.string(),
               !quoted.empty()     ? quoted
               : defaultProgram_ ? ""
                                 : " (does the program link the tpscope probes runtime and start it?)");
    fmt::print(out_, "exit status {} ({}); rank logs are in {}\n", code_ == 0 ? kExitFailure : code_,
               code_ == 0 ? "no trace" : outcomeText_, logs_.string());
    return code_ == 0 ? kExitFailure : code_;
  }
  if (!missingRanks_.empty()) {
    std::string list;
    for (int r : missingRanks_) list += (list.empty() ? "" : ", ") + std::to_string(r);
    fmt::print(out_, "no trace file from rank{} {} (they ended before recording)\n",
               missingRanks_.size() > 1 ? "s" : "", list);
    if (std::string line = lastErrorLine(logOf(missingRanks_.front())); !line.empty())
      fmt::print(out_, "  rank {}'s log ends with: {}\n", missingRanks_.front(), line);
  }
  auto merged = tracedb::merge(files, runFile_);
  if (!merged) {
    fmt::print(err_, "tpscope capture: error: merge failed: {}\n", merged.error());
    fmt::print(out_, "exit status {}; the rank files are in {}\n", code_ == 0 ? kExitFailure : code_, dir_.string());
    return code_ == 0 ? kExitFailure : code_;
  }
  if (tracedb::Status e = tracedb::addMeta(runFile_, meta); !e)
    fmt::print(err_, "tpscope capture: warning: {}\n", e.message());
  if (stalls_)
    if (tracedb::Status e = tracedb::addAlerts(runFile_, stalls_->alerts()); !e)
      fmt::print(err_, "tpscope capture: warning: the live stall lines were not kept: {}\n", e.message());
  if (tracedb::Status e = analysis::writeRunSummary(runFile_); !e)
    fmt::print(err_, "tpscope capture: warning: summaries not written (the analyses will compute them): {}\n",
               e.message());
  fmt::print(out_, "merged {} rank file{} → {} ({} spans, {} collectives)\n", merged->ranks,
             merged->ranks == 1 ? "" : "s", runFile_.string(), merged->spans, merged->collectives);
  return std::nullopt;
}

// Prints the diagnosis of the run file (at most maxFindings) and writes the HTML report when asked.
void CaptureSession::diagnose() {
  auto reader = tracedb::Reader::open(runFile_);
  if (!reader) {
    fmt::print(err_, "tpscope capture: error: {}\n", reader.error());
    return;
  }
  std::map<int, tracedb::RankInfo> rankInfo;
  if (auto rs = (*reader)->ranks())
    for (auto& r : *rs) rankInfo[r.rank] = r;
  const analysis::DiagnoseResult d = analysis::diagnose(**reader);
  std::ostringstream chain;  // the root-cause chain first, when there is one
  report::printChain(d, chain);
  fmt::print(out_, "{}", chain.str());
  // Then the findings the chain does not hold (a finding in it was printed there, with its consequences).
  const std::vector<int> inChain = analysis::chainFindings(d.chain);
  int shown = 0;
  for (size_t i = 0; i < d.findings.size(); ++i) {
    const analysis::Finding& f = d.findings[i];
    if (std::binary_search(inChain.begin(), inChain.end(), static_cast<int>(i))) continue;
    if (shown >= o_.maxFindings) break;
    if (f.severity == analysis::Severity::Info && shown + static_cast<int>(inChain.size()) > 0) continue;
    fmt::print(out_, "{}", formatFinding(f, rankInfo));
    ++shown;
  }
  if (d.findings.empty()) fmt::print(out_, "diagnosis: no findings\n");
  const int more = static_cast<int>(d.findings.size() - inChain.size()) - shown;
  if (more > 0)
    fmt::print(out_, "{} more finding{}: tpscope diagnose {}\n", more, more == 1 ? "" : "s", runFile_.string());
  for (const auto& e : d.errors) fmt::print(err_, "tpscope capture: warning: analysis {}\n", e);
  if (!o_.html.empty() && !writeHtmlReport(**reader, o_.html, out_, err_) && code_ == kExitSuccess)
    code_ = kExitFailure;
}

}  // namespace

int runCapture(const CaptureOptions& o, std::FILE* out, std::FILE* err, bool tty) {
  CaptureSession session(o, out, err, tty);
  if (auto code = session.validate()) return *code;
  if (auto code = session.prepare()) return *code;
  if (auto code = session.spawn()) return *code;
  session.watch();
  return session.finish();
}

}  // namespace tpscope::cli::capture
