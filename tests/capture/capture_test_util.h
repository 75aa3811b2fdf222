// Helpers of the multi-process capture tests: run `tpscope capture` (the real binary, real ranks over loopback Gloo)
// and ask the resulting run.db questions in SQL.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../ports.h"

namespace tpscope::capture_test {

namespace fs = std::filesystem;

struct RunResult {
  int status = -1;  // exit status (128 + signal when killed)
  std::string output;
};

// A fresh folder under the build tree for one test.
inline fs::path testDir(const std::string& name) {
  fs::path d = fs::path(TPSCOPE_TEST_TMP) / name;
  std::error_code ec;
  fs::remove_all(d, ec);
  fs::create_directories(d);
  return d;
}

// Runs in the forked child before exec (limits, signal dispositions, mounts): 0 to go on, else the child's exit
// status.
using BeforeExec = std::function<int()>;

// Starts `argv` with stdout+stderr into `log`; returns the pid.
inline pid_t startProcess(const std::vector<std::string>& argv, const fs::path& log,
                          const BeforeExec& beforeExec = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
    if (beforeExec)
      if (const int status = beforeExec(); status != 0) std::_Exit(status);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  return pid;
}

inline int waitStatus(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

inline std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline RunResult run(const std::vector<std::string>& argv, const fs::path& log, const BeforeExec& beforeExec = {}) {
  RunResult r;
  r.status = waitStatus(startProcess(argv, log, beforeExec));
  r.output = readFile(log);
  return r;
}

// The argv of `tpscope capture` with the tiny config; `extra` after the standard arguments.
inline std::vector<std::string> captureArgv(const fs::path& dir, int nproc, int tp, int dp, int steps,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {TPSCOPE_BIN, "capture",           "--nproc", std::to_string(nproc),
                                   "--tp",      std::to_string(tp),  "--dp",    std::to_string(dp),
                                   "--config",  TPSCOPE_TINY_CONFIG, "--steps", std::to_string(steps),
                                   "--out",     dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The tiny config with `extra` keys, written into `dir` (the corpus found where the tiny config's is).
inline fs::path configWith(const fs::path& dir, const nlohmann::json& extra) {
  nlohmann::json c = nlohmann::json::parse(readFile(TPSCOPE_TINY_CONFIG));
  c["corpus"] = (fs::path(TPSCOPE_TINY_CONFIG).parent_path() / c["corpus"].get<std::string>()).lexically_normal();
  for (const auto& [k, v] : extra.items()) c[k] = v;
  const fs::path file = dir.parent_path() / (dir.filename().string() + ".config.json");
  std::ofstream(file) << c.dump(2);
  return file;
}

inline std::vector<std::string> withConfig(std::vector<std::string> argv, const fs::path& config) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--config") argv[i + 1] = config.string();
  return argv;
}

// Where capture()/startCapture() put capture's own output: beside the capture folder.
inline fs::path captureLog(const fs::path& dir) {
  return dir.parent_path() / (dir.filename().string() + ".capture.log");
}

// `tpscope capture` with the tiny config, run to its end.
inline RunResult capture(const fs::path& dir, int nproc, int tp, int dp, int steps,
                         const std::vector<std::string>& extra, const BeforeExec& beforeExec = {}) {
  return run(captureArgv(dir, nproc, tp, dp, steps, extra), captureLog(dir), beforeExec);
}

// The same, started in the background; wait for it with waitStatus() and read captureLog(dir).
inline pid_t startCapture(const fs::path& dir, int nproc, int tp, int dp, int steps,
                          const std::vector<std::string>& extra, const BeforeExec& beforeExec = {}) {
  return startProcess(captureArgv(dir, nproc, tp, dp, steps, extra), captureLog(dir), beforeExec);
}

// The pid of the child of `parent` whose environment has RANK=`rank` (a rank capture launched); -1 if none.
inline pid_t rankPid(pid_t parent, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses, so parse after the last ')'.
    const std::string stat = readFile(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = -1;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    for (std::string kv; std::getline(env, kv, '\0');)
      if (kv == want) return static_cast<pid_t>(std::stoll(name));
  }
  return -1;
}

// A free loopback port P with P + 1 free too (the rendezvous and the node captures' control channel; tests/ports.h).
inline int freePortPair() {
  return tpscope::testing::freeListenPorts(2);
}

// A read-only SQL view of a trace file.
class Db {
 public:
  explicit Db(const fs::path& file) {
    if (sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << file;
    }
    sqlite3_busy_timeout(db_, 2000);  // a live rank file: the recorder may be mid-commit
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Rows of text columns (NULL as "NULL"). An SQL error is a test failure unless `quiet` (a file still being
  // created: no tables yet).
  std::vector<std::vector<std::string>> rows(const std::string& sql, bool quiet = false) {
    std::vector<std::vector<std::string>> out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      if (!quiet) ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(st); ++c) {
        const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
        row.push_back(t != nullptr ? t : "NULL");
      }
      out.push_back(std::move(row));
    }
    sqlite3_finalize(st);
    return out;
  }
  // The first column of the first row ("" when there is none).
  std::string value(const std::string& sql, bool quiet = false) {
    auto r = rows(sql, quiet);
    return r.empty() || r[0].empty() ? std::string() : r[0][0];
  }
  // -1 when there is no row, the value is NULL, or (quiet) the query failed.
  int64_t integer(const std::string& sql, bool quiet = false) {
    const std::string v = value(sql, quiet);
    return v.empty() || v == "NULL" ? -1 : std::stoll(v);
  }

 private:
  sqlite3* db_ = nullptr;
};

// `PRAGMA integrity_check` of a trace file: "ok", or SQLite's list of problems (or why it could not be opened).
inline std::string integrityCheck(const fs::path& file) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    out = std::string("cannot open: ") + (db != nullptr ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return out;
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) != SQLITE_OK) {
    out = std::string("integrity_check: ") + sqlite3_errmsg(db);
  } else {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      out += (out.empty() ? "" : "; ") + std::string(t != nullptr ? t : "NULL");
    }
    if (rc != SQLITE_DONE) out += std::string(out.empty() ? "" : "; ") + sqlite3_errmsg(db);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// One finding of `tpscope diagnose --json` (docs/diagnosis.md, version 1), the fields the capture tests check.
struct Finding {
  std::string kind, severity;
  int rank = -1, step = -1, layer = -1;
  std::string group;  // collective; "" when null
  int64_t seq = -1;
  std::vector<int> ranks;
  std::string message;
  std::map<std::string, std::string> numbers;  // evidence.numbers, as JSON text ("1", "\"size_mismatch\"")
};

struct Diagnosis {
  int status = -1;  // diagnose's exit status
  std::vector<Finding> findings;
  std::string json;  // the whole output, for failure messages
  std::vector<Finding> ofKind(const std::string& kind, const std::string& severity = "") const {
    std::vector<Finding> out;
    for (const auto& f : findings)
      if (f.kind == kind && (severity.empty() || f.severity == severity)) out.push_back(f);
    return out;
  }
  // One line per finding, for failure messages.
  std::string summary() const {
    std::ostringstream s;
    for (const auto& f : findings) {
      s << f.severity << " " << f.kind << " rank " << f.rank << " step " << f.step << " layer " << f.layer;
      if (!f.group.empty()) s << " " << f.group << " seq " << f.seq;
      s << ": " << f.message << "\n";
    }
    return s.str();
  }
};

// Runs `tpscope diagnose --json` on a run file and parses its findings (a parse failure is a test failure).
inline Diagnosis diagnose(const fs::path& runFile) {
  Diagnosis d;
  const RunResult r = run({TPSCOPE_BIN, "diagnose", "--json", runFile.string()},
                          runFile.parent_path() / (runFile.stem().string() + ".diagnose.json"));
  d.status = r.status;
  d.json = r.output;
  const auto j = nlohmann::json::parse(r.output, nullptr, false);
  if (j.is_discarded() || !j.contains("findings")) {
    ADD_FAILURE() << "diagnose --json " << runFile << " (exit " << r.status << ") is not the JSON contract:\n"
                  << r.output;
    return d;
  }
  for (const auto& jf : j["findings"]) {
    Finding f;
    f.kind = jf.value("kind", "");
    f.severity = jf.value("severity", "");
    f.rank = jf.value("rank", -1);
    f.step = jf.value("step", -1);
    f.layer = jf.value("layer", -1);
    if (jf.contains("collective") && jf["collective"].is_object()) {
      f.group = jf["collective"].value("group", "");
      f.seq = jf["collective"].value("seq", int64_t{-1});
    }
    if (jf.contains("ranks") && jf["ranks"].is_array())
      for (const auto& r : jf["ranks"]) f.ranks.push_back(r.get<int>());
    f.message = jf.value("message", "");
    if (jf.contains("evidence") && jf["evidence"].contains("numbers"))
      for (const auto& [k, v] : jf["evidence"]["numbers"].items()) f.numbers[k] = v.dump();
    d.findings.push_back(std::move(f));
  }
  return d;
}

}  // namespace tpscope::capture_test
