#include "capture/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/progress_display.h"
#include "capture/python_program.h"
#include "capture/rank_process.h"
#include "capture/run_poller.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/html_report.h"
#include "tpscope/core/fault_spec.h"
#include "tpscope/core/health_rules.h"
#include "tpscope/probes/tcp_store.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/reader.h"

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

// ranks.exit_reason as the launcher saw it. The prefix matters: the crash analysis takes "crash..." as a crash and
// "stopped by ..." as not one, whatever signal the text names (analysis/crash.h).
// A rank capture signalled counts as stopped by capture only if a signal ended it (the recorder re-raises SIGTERM
// after its dump); one that exited with a status of its own ended on its own terms.
std::string rankExitReason(const ExitStatus& s, bool stoppedByCapture, const std::string& stopWhy) {
  const bool byOurSignal = stoppedByCapture && (s.signaled || s.code >= 128);
  if (byOurSignal) return fmt::format("stopped by capture ({})", stopWhy);
  if (s.ok()) return "ok";
  switch (outcomeOfRankExit(s)) {
    case Outcome::BadArgs: return fmt::format("bad config or arguments: {}", s.describe());
    case Outcome::Hang: return fmt::format("collective timeout or failure: {}", s.describe());
    case Outcome::NonFinite: return fmt::format("stopped on non-finite values: {}", s.describe());
    default: return fmt::format("crash: {}", s.describe());
  }
}

// Writes the launcher's verdict into a rank file (the process is gone). Errors are returned as text.
std::string markRankFile(const fs::path& file, const std::string& reason, const std::string& status) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    std::string e = db != nullptr ? sqlite3_errmsg(db) : "cannot open";
    sqlite3_close(db);
    return fmt::format("{}: {}", file.string(), e);
  }
  sqlite3_busy_timeout(db, 2000);
  std::string error;
  auto exec = [&](const char* sql, const std::string& a, const std::string& b) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
      error = sqlite3_errmsg(db);
      return;
    }
    sqlite3_bind_text(st, 1, a.c_str(), -1, SQLITE_TRANSIENT);
    if (!b.empty()) sqlite3_bind_text(st, 2, b.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) error = sqlite3_errmsg(db);
    sqlite3_finalize(st);
  };
  exec("UPDATE ranks SET exit_reason = ?1", reason, "");
  if (error.empty()) exec("INSERT OR REPLACE INTO meta(key, value) VALUES('capture_exit', ?1)", status, "");
  sqlite3_close(db);
  return error.empty() ? std::string() : fmt::format("{}: {}", file.string(), error);
}

std::string setRunMeta(const fs::path& file, const std::vector<std::pair<std::string, std::string>>& kv) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return fmt::format("{}: cannot open to add capture meta", file.string());
  }
  sqlite3_busy_timeout(db, 2000);
  std::string error;
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  for (const auto& [k, v] : kv) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)", -1, &st, nullptr) !=
        SQLITE_OK) {
      error = sqlite3_errmsg(db);
      break;
    }
    sqlite3_bind_text(st, 1, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, v.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) error = sqlite3_errmsg(db);
    sqlite3_finalize(st);
  }
  sqlite3_exec(db, error.empty() ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  return error.empty() ? std::string() : fmt::format("{}: {}", file.string(), error);
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// One finding in the story's layout:
//   CRITICAL nan_origin  rank 1 (tp 1, dp 0, host h)  step 3  layer 0
//            message / details
std::string formatFinding(const analysis::Finding& f, const std::map<int, tracedb::RankInfo>& ranks) {
  std::string head = fmt::format("{:<8} {}", upper(analysis::severityName(f.severity)),
                                 analysis::findingKindName(f.kind));
  if (f.rank >= 0) {
    head += fmt::format("  rank {}", f.rank);
    if (auto it = ranks.find(f.rank); it != ranks.end())
      head += fmt::format(" (tp {}, dp {}, host {})", it->second.tpRank, it->second.dpRank, it->second.host);
  }
  if (f.collective) head += fmt::format("  group {} seq {}", f.collective->group, f.collective->seq);
  if (f.step >= 0) head += fmt::format("  step {}", f.step);
  if (f.layer >= 0) head += fmt::format("  layer {}", f.layer);
  std::string out = head + "\n         " + f.message + "\n";
  for (const auto& d : f.details) out += "         " + d + "\n";
  return out;
}

std::string formatAlert(const LiveAlert& a) {
  std::string where = fmt::format("rank {}", a.rank);
  if (!a.host.empty()) where += fmt::format(" (host {})", a.host);
  if (a.step >= 0) where += fmt::format("  step {}", a.step);
  if (a.layer >= 0) where += fmt::format("  layer {}", a.layer);
  if (!a.param.empty()) where += fmt::format("  {}", a.param);
  std::string out = fmt::format("ALERT {} {}  {}\n      {}", upper(a.severity), a.kind, where, a.message);
  if (!a.evidence.empty() && a.evidence != "{}") out += "\n      evidence " + a.evidence;
  return out;
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
  analysis::HtmlReportOptions options;
  options.generator = "tpscope " TPSCOPE_VERSION;
  auto report = analysis::renderHtmlReport(run, options);
  tracedb::Status s = report ? analysis::writeHtmlFile(file, report->html) : report.status();
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

int runCapture(const CaptureOptions& o, std::FILE* out, std::FILE* err, bool tty) {
  auto bad = [&](const std::string& why) {
    fmt::print(err, "tpscope capture: error: {}\n", why);
    return kExitBadArgs;
  };

  // ---- 1. validate ------------------------------------------------------------------------------------------------
  if (o.nproc < 1 || o.nproc > 4096) return bad(fmt::format("--nproc {} must be between 1 and 4096", o.nproc));
  if (o.out.empty()) return bad("--out DIR is required");
  if (!(o.hangTimeoutS > 0)) return bad(fmt::format("--hang-timeout {} must be > 0 seconds", o.hangTimeoutS));
  int tp = o.tp, dp = o.dp;
  if (tp < 0 || dp < 0) return bad("--tp and --dp must be positive");
  if (tp == 0 && dp == 0) dp = 1;
  if (tp == 0) {
    if (o.nproc % dp != 0) return bad(fmt::format("--dp {} does not divide --nproc {}", dp, o.nproc));
    tp = o.nproc / dp;
  } else if (dp == 0) {
    if (o.nproc % tp != 0) return bad(fmt::format("--tp {} does not divide --nproc {}", tp, o.nproc));
    dp = o.nproc / tp;
  }
  if (tp * dp != o.nproc) return bad(fmt::format("--tp {} x --dp {} = {} ranks, but --nproc is {}", tp, dp, tp * dp,
                                                 o.nproc));
  const bool defaultProgram = o.program.empty();
  std::vector<std::string> argv;
  std::optional<int> layers, totalSteps = o.steps;
  if (o.steps && *o.steps < 1) return bad(fmt::format("--steps {} must be >= 1", *o.steps));
  if (defaultProgram) {
    if (o.config.empty()) return bad("--config FILE is required to run tpscope-train (or give -- PROGRAM ARGS...)");
    std::error_code ec;
    if (!fs::is_regular_file(o.config, ec)) return bad(fmt::format("--config {}: no such file", o.config.string()));
    const fs::path train = findTrainProgram(o.self);
    if (train.empty())
      return bad("tpscope-train was not found beside tpscope, in ../core/ or on PATH; give -- PROGRAM ARGS...");
    argv = {train.string(), "--config", fs::absolute(o.config).string(), "--tp", std::to_string(tp), "--dp",
            std::to_string(dp)};
    if (o.steps) argv.insert(argv.end(), {"--steps", std::to_string(*o.steps)});
    layers = configInt(o.config, "layers");
    if (!totalSteps) totalSteps = configInt(o.config, "steps");
    if (!totalSteps) totalSteps = 20;  // tpscope-train's default (docs/config.md)
  } else {
    const fs::path prog = resolveProgram(o.program.front());
    if (prog.empty()) return bad(fmt::format("program '{}' not found or not executable", o.program.front()));
    argv = o.program;
    argv.front() = prog.string();
  }
  std::map<std::string, std::string> programEnv;  // a Python program: PYTHONPATH with the tpscope package
  std::string pythonNote, pythonError;
  if (!defaultProgram && !instrumentPythonProgram(argv, o.self, &programEnv, &pythonNote, &pythonError))
    return bad(pythonError);
  std::vector<core::FaultSpec> faults;
  for (const auto& text : o.inject) {
    std::string error;
    auto spec = core::parseFaultSpec(text, &error);
    if (!spec) return bad(error);
    if (std::string why = core::checkFaultSpec(*spec, o.nproc, layers.value_or(0)); !why.empty()) return bad(why);
    faults.push_back(*spec);
  }
  std::string healthText;
  if (!o.onNonfinite.empty()) {
    if (!core::parseHealthPolicy(o.onNonfinite))
      return bad(fmt::format("--on-nonfinite {}: expected warn, skip-step or stop", o.onNonfinite));
    healthText = "nonfinite=" + o.onNonfinite;
  }
  if (!o.health.empty()) healthText += (healthText.empty() ? "" : ",") + o.health;
  if (!healthText.empty()) {
    std::string error;
    if (!core::parseHealthOptions(healthText, &error)) return bad(error);
  }

  // ---- 2. prepare the folder, the store, the port --------------------------------------------------------------
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec || !fs::is_directory(o.out)) return bad(fmt::format("--out {}: cannot create the folder: {}", o.out.string(),
                                                             ec ? ec.message() : "not a folder"));
  const fs::path dir = fs::absolute(o.out);
  // Refused before anything in it is removed or any rank starts (a read-only folder, no permission).
  if (std::string why = writeProblem(dir); !why.empty())
    return bad(fmt::format("--out {}: cannot write in this folder: {}", o.out.string(), why));
  const fs::path logs = dir / "logs";
  fs::create_directories(logs, ec);
  if (ec || !fs::is_directory(logs))
    return bad(fmt::format("--out {}: cannot create {}: {}", o.out.string(), logs.string(),
                           ec ? ec.message() : "not a folder"));
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool rankFile = name.starts_with("rank-") && (name.ends_with(".db") || name.ends_with(".db-wal") ||
                                                        name.ends_with(".db-shm") || name.ends_with(".db-journal"));
    const bool runFile = name == "run.db" || name == "run.db-wal" || name == "run.db-shm";
    if (rankFile || runFile) removed += fs::remove(entry.path(), ec) ? 1 : 0;
  }
  for (const auto& entry : fs::directory_iterator(logs, ec))
    if (entry.path().filename().string().starts_with("rank-")) fs::remove(entry.path(), ec);
  if (removed > 0) fmt::print(out, "replacing the previous capture in {}\n", dir.string());

  std::string storeError;
  auto store = probes::TcpKvServer::listen("127.0.0.1", 0, &storeError);
  if (!store) {
    fmt::print(err, "tpscope capture: error: cannot start the clock store on loopback: {}\n", storeError);
    return kExitFailure;
  }
  const int masterPort = freeLoopbackPort();
  if (masterPort == 0) {
    fmt::print(err, "tpscope capture: error: no free loopback port for MASTER_PORT\n");
    return kExitFailure;
  }
  const int64_t epochNs = unixNowNs();
  const std::string runId = fmt::format("{}-{}-{}", dir.filename().string(), epochNs / 1'000'000'000, ::getpid());

  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + shellQuote(a);
  fmt::print(out, "capture: {} ranks (tp {} x dp {}) → {}\n  {}\n", o.nproc, tp, dp, dir.string(), command);
  if (!faults.empty()) fmt::print(out, "  inject: {}\n", core::formatFaultList(faults));
  if (!healthText.empty()) fmt::print(out, "  health: {}\n", healthText);
  if (!pythonNote.empty()) fmt::print(out, "  python: {}\n", pythonNote);
  std::fflush(out);

  // ---- 3. spawn -------------------------------------------------------------------------------------------------
  InterruptGuard interrupts;
  std::vector<RankProcess> ranks;
  for (int r = 0; r < o.nproc; ++r) {
    std::map<std::string, std::string> set = {
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(masterPort)},
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(o.nproc)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
        {"GROUP_RANK", "0"},
        {"TPSCOPE_OUT", dir.string()},
        {"TPSCOPE_RUN_ID", runId},
        {"TPSCOPE_EPOCH_NS", std::to_string(epochNs)},
        {"TPSCOPE_CLOCK_STORE", fmt::format("127.0.0.1:{}", store->port())},
        {"TPSCOPE_INJECT", core::formatFaultList(faults)},
        {"TPSCOPE_HEALTH", healthText},
        {"TPSCOPE_TP", std::to_string(tp)},
        {"TPSCOPE_DP", std::to_string(dp)},
    };
    set.insert(programEnv.begin(), programEnv.end());
    if (std::getenv("OMP_NUM_THREADS") == nullptr) set["OMP_NUM_THREADS"] = "1";
    std::string error;
    auto p = RankProcess::spawn(r, argv, rankEnvironment(set), logs / fmt::format("rank-{}.log", r), &error);
    if (!p) {
      for (auto& q : ranks) q.signal(SIGKILL);
      for (auto& q : ranks)
        while (!q.poll() && q.running()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return bad(fmt::format("rank {}: {}", r, error));
    }
    ranks.push_back(std::move(*p));
  }

  // ---- 4. watch -------------------------------------------------------------------------------------------------
  RunPoller poller(dir, o.nproc);
  ProgressDisplay display(out, tty);
  const auto start = Clock::now();
  auto lastProgress = start;
  auto lastPoll = start - std::chrono::hours(1);
  std::optional<Outcome> outcome;  // first abnormal event decides
  std::string stopWhy;             // for the stopped ranks' exit reason
  enum class Stop { None, Dumping, Terminating, Killing } stop = Stop::None;
  Clock::time_point stopAt{};
  std::vector<bool> signaled(static_cast<size_t>(o.nproc), false);
  int interruptsSeen = 0;

  auto beginStop = [&](Outcome why, const std::string& whyText, const std::string& message) {
    if (!outcome) outcome = why;
    if (stop != Stop::None) return;
    stopWhy = whyText;
    display.message(message);
    stop = Stop::Dumping;
    stopAt = Clock::now();
    for (auto& p : ranks) {
      if (!p.running()) continue;
      p.signal(SIGUSR1);
      signaled[static_cast<size_t>(p.rank())] = true;
    }
  };
  auto secondsSince = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };

  while (true) {
    // Reap. When several ranks are found ended in one look, the likeliest first cause goes first: a rank killed by
    // a signal or failing on its own (crash) before one whose collective failed because a peer was gone.
    bool anyRunning = false;
    std::vector<RankProcess*> ended;
    for (auto& p : ranks)
      if (p.poll()) ended.push_back(&p);
    auto causeRank = [](const RankProcess* p) {
      switch (outcomeOfRankExit(*p->status())) {
        case Outcome::Crash: return 0;
        case Outcome::NonFinite: return 1;
        case Outcome::BadArgs: return 2;
        default: return 3;
      }
    };
    std::stable_sort(ended.begin(), ended.end(),
                     [&](const RankProcess* a, const RankProcess* b) { return causeRank(a) < causeRank(b); });
    for (RankProcess* endedRank : ended) {
      RankProcess& p = *endedRank;
      {
        const ExitStatus& s = *p.status();
        const bool ours = signaled[static_cast<size_t>(p.rank())];
        if (!s.ok() && !ours) {
          const Outcome oc = outcomeOfRankExit(s);
          std::string msg = fmt::format("rank {} (pid {}) ended: {}", p.rank(), p.pid(), s.describe());
          if (oc == Outcome::Hang) msg += " (collective timeout or failure)";
          if (oc == Outcome::NonFinite) msg += " (stopped on non-finite values)";
          if (oc == Outcome::BadArgs) msg += " (refused its arguments or config)";
          const std::string tail = tailOfFile(logs / fmt::format("rank-{}.log", p.rank()), 8);
          if (!tail.empty()) {
            msg += fmt::format("\n  last lines of {}:", (logs / fmt::format("rank-{}.log", p.rank())).string());
            std::string_view t = tail;
            while (!t.empty()) {
              const size_t nl = t.find('\n');
              msg += "\n    " + std::string(t.substr(0, nl));
              if (nl == std::string_view::npos) break;
              t.remove_prefix(nl + 1);
            }
          }
          bool others = false;
          for (auto& q : ranks) others |= q.running();
          if (others && stop == Stop::None) msg += "\n  dumping and stopping the other ranks";
          beginStop(oc, fmt::format("after rank {} ended: {}", p.rank(),
                                    s.signaled ? "by " + signalName(s.signal) : s.describe()),
                    msg);
        }
      }
    }
    for (auto& p : ranks) anyRunning |= p.running();
    if (!anyRunning) break;

    // Ctrl-C / SIGTERM to capture.
    const int interruptsNow = g_interrupts.load(std::memory_order_relaxed);
    if (interruptsNow > interruptsSeen) {
      if (stop == Stop::None) {
        beginStop(Outcome::Interrupted, "interrupted", "interrupted — dumping all ranks (again to kill them now)");
        outcome = Outcome::Interrupted;
      } else if (interruptsSeen > 0 || stop != Stop::Dumping) {
        for (auto& p : ranks) p.signal(SIGKILL);
        stop = Stop::Killing;
      }
      interruptsSeen = interruptsNow;
    }

    // Progress, alerts, watchdog.
    if (Clock::now() - lastPoll >= std::chrono::milliseconds(o.pollMs)) {
      lastPoll = Clock::now();
      std::vector<LiveAlert> alerts;
      if (poller.poll(&alerts)) lastProgress = lastPoll;
      for (const auto& a : alerts) display.message(formatAlert(a));
      ProgressLine line;
      line.step = poller.completedStep();
      line.totalSteps = totalSteps.value_or(0);
      const RankProgress& r0 = poller.rank(0);
      if (r0.lastStep > 0) {
        line.loss = r0.lastLoss;
        line.haveLoss = true;
        if (r0.meanStepNs > 0) {
          line.tokensPerS = static_cast<double>(r0.tokens) * dp / (r0.meanStepNs * 1e-9);
          if (line.totalSteps > 0) line.etaS = (line.totalSteps - line.step) * r0.meanStepNs * 1e-9;
        }
      }
      if (line.step > 0) display.update(line);
      // Until every rank has finished a step (rendezvous, model build, first step), allow at least the startup time.
      const double limit = poller.completedStep() >= 1 ? o.hangTimeoutS : std::max(o.hangTimeoutS, o.startupTimeoutS);
      if (stop == Stop::None && secondsSince(lastProgress) > limit)
        beginStop(Outcome::Hang, fmt::format("hang watchdog: no progress for {:g} s", limit),
                  fmt::format("no progress for {:g} s — dumping all ranks", limit));
    }

    // The stop sequence.
    if (stop == Stop::Dumping && secondsSince(stopAt) >= o.dumpWaitS) {
      for (auto& p : ranks) p.signal(SIGTERM);
      stop = Stop::Terminating;
      stopAt = Clock::now();
    } else if (stop == Stop::Terminating && secondsSince(stopAt) >= o.termGraceS) {
      for (auto& p : ranks) {
        if (p.running()) display.message(fmt::format("rank {} did not exit after SIGTERM — SIGKILL", p.rank()));
        p.signal(SIGKILL);
      }
      stop = Stop::Killing;
      stopAt = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // One last look for alerts written at the very end.
  {
    std::vector<LiveAlert> alerts;
    poller.poll(&alerts);
    for (const auto& a : alerts) display.message(formatAlert(a));
  }
  display.finish();
  poller.close();
  const Outcome finalOutcome = outcome.value_or(Outcome::Success);
  int code = exitCodeOf(finalOutcome);
  std::string outcomeText = outcomeName(finalOutcome);
  bool traceIncomplete = false;
  // A rank whose recorder could not write (a full disk, a file size limit) trained on, but its trace has holes: that
  // is said, and a run that otherwise succeeded ends with kExitFailure.
  for (auto& p : ranks) {
    const fs::path log = logs / fmt::format("rank-{}.log", p.rank());
    if (std::string why = recorderWriteFailure(log); !why.empty()) {
      fmt::print(err, "tpscope capture: error: rank {}'s trace is incomplete: {} (see {})\n", p.rank(), why,
                 log.string());
      traceIncomplete = true;
      if (code == kExitSuccess) {
        code = kExitFailure;
        outcomeText = "incomplete trace";
      }
    }
  }

  // ---- 5. mark, merge, diagnose ---------------------------------------------------------------------------------
  std::vector<std::pair<std::string, std::string>> meta = {
      {"capture_outcome", outcomeText},
      {"capture_exit_status", std::to_string(code)},
      {"capture_command", command},
      {"capture_inject", core::formatFaultList(faults)},
      {"capture_health", healthText},
      {"capture_hang_timeout_s", fmt::format("{:g}", o.hangTimeoutS)},
  };
  std::vector<int> missing;
  for (auto& p : ranks) {
    const fs::path file = dir / fmt::format("rank-{}.db", p.rank());
    const ExitStatus& s = *p.status();
    const bool ours = signaled[static_cast<size_t>(p.rank())];
    meta.emplace_back(fmt::format("capture_rank_exit:{}", p.rank()),
                      s.describe() + (ours && (s.signaled || s.code >= 128) ? " (stopped by capture)" : ""));
    if (!fs::exists(file, ec)) {
      missing.push_back(p.rank());
      continue;
    }
    if (s.ok()) continue;  // the rank said "ok" itself
    if (std::string e = markRankFile(file, rankExitReason(s, ours, stopWhy), s.describe()); !e.empty())
      fmt::print(err, "tpscope capture: warning: cannot record rank {}'s exit: {}\n", p.rank(), e);
  }
  store.reset();

  const auto files = tracedb::rankFiles(dir);
  const fs::path runFile = dir / "run.db";
  if (files.empty()) {
    fmt::print(err, "tpscope capture: error: no rank wrote a trace file in {}{}\n", dir.string(),
               defaultProgram ? "" : " (does the program link the tpscope probes runtime and start it?)");
    fmt::print(out, "exit status {} ({}); rank logs are in {}\n", code == 0 ? kExitFailure : code,
               code == 0 ? "no trace" : outcomeText, logs.string());
    return code == 0 ? kExitFailure : code;
  }
  if (!missing.empty()) {
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    fmt::print(out, "no trace file from rank{} {} (they ended before recording)\n", missing.size() > 1 ? "s" : "",
               list);
  }
  auto merged = tracedb::merge(files, runFile);
  if (!merged) {
    fmt::print(err, "tpscope capture: error: merge failed: {}\n", merged.error());
    fmt::print(out, "exit status {}; the rank files are in {}\n", code == 0 ? kExitFailure : code, dir.string());
    return code == 0 ? kExitFailure : code;
  }
  if (std::string e = setRunMeta(runFile, meta); !e.empty())
    fmt::print(err, "tpscope capture: warning: {}\n", e);
  fmt::print(out, "merged {} rank file{} → {} ({} spans, {} collectives)\n", merged->ranks,
             merged->ranks == 1 ? "" : "s", runFile.string(), merged->spans, merged->collectives);

  auto reader = tracedb::Reader::open(runFile);
  if (!reader) {
    fmt::print(err, "tpscope capture: error: {}\n", reader.error());
  } else {
    std::map<int, tracedb::RankInfo> rankInfo;
    if (auto rs = (*reader)->ranks())
      for (auto& r : *rs) rankInfo[r.rank] = r;
    const analysis::DiagnoseResult d = analysis::diagnose(**reader);
    int shown = 0;
    for (const auto& f : d.findings) {
      if (shown >= o.maxFindings) break;
      if (f.severity == analysis::Severity::Info && shown > 0) continue;
      fmt::print(out, "{}", formatFinding(f, rankInfo));
      ++shown;
    }
    if (d.findings.empty()) fmt::print(out, "diagnosis: no findings\n");
    const int more = static_cast<int>(d.findings.size()) - shown;
    if (more > 0) fmt::print(out, "{} more finding{}: tpscope diagnose {}\n", more, more == 1 ? "" : "s",
                             runFile.string());
    for (const auto& e : d.errors) fmt::print(err, "tpscope capture: warning: analysis {}\n", e);
    if (!o.html.empty() && !writeHtmlReport(**reader, o.html, out, err) && code == kExitSuccess) code = kExitFailure;
  }
  if (code == kExitSuccess)
    fmt::print(out, "exit status 0 (success); every rank's records are in {}\n", runFile.string());
  else
    fmt::print(out, "exit status {} ({}); {} records are in {}\n", code, outcomeText,
               traceIncomplete ? "what the ranks could write of their" : "every rank's", runFile.string());
  std::fflush(out);
  return code;
}

}  // namespace tpscope::cli::capture
