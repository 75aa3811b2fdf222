// Helpers of the multi-process capture tests: run `tpscope capture` (the real binary, real ranks over loopback Gloo)
// and ask the resulting run.db questions in SQL.
#pragma once

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

// Starts `argv` with stdout+stderr into `log`; returns the pid.
inline pid_t startProcess(const std::vector<std::string>& argv, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
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

inline RunResult run(const std::vector<std::string>& argv, const fs::path& log) {
  RunResult r;
  r.status = waitStatus(startProcess(argv, log));
  r.output = readFile(log);
  return r;
}

// `tpscope capture` with the tiny config; `extra` after the standard arguments.
inline RunResult capture(const fs::path& dir, int nproc, int tp, int dp, int steps,
                         const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {TPSCOPE_BIN,  "capture", "--nproc", std::to_string(nproc),
                                   "--tp",       std::to_string(tp), "--dp", std::to_string(dp),
                                   "--config",   TPSCOPE_TINY_CONFIG, "--steps", std::to_string(steps),
                                   "--out",      dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run(argv, dir.parent_path() / (dir.filename().string() + ".capture.log"));
}

// A read-only SQL view of a trace file.
class Db {
 public:
  explicit Db(const fs::path& file) {
    if (sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << file;
    }
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Rows of text columns (NULL as "NULL").
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    std::vector<std::vector<std::string>> out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
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
  std::string value(const std::string& sql) {
    auto r = rows(sql);
    return r.empty() || r[0].empty() ? std::string() : r[0][0];
  }
  int64_t integer(const std::string& sql) {
    const std::string v = value(sql);
    return v.empty() || v == "NULL" ? -1 : std::stoll(v);
  }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace tpscope::capture_test
