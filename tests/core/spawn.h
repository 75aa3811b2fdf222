// Launches the ranks of a multi-process test as REAL processes (posix_spawn, never fork: the launcher may have
// initialised threads) with torchrun's environment on a free loopback port, and waits for them with a deadline.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../ports.h"

extern char** environ;

namespace tpscope::testing {

struct RankResult {
  int exitCode = -1;   // -1: killed at the deadline
  std::string output;  // stdout + stderr
};

// A loopback port for the ranks' store (tests/ports.h: below the ephemeral range, free a moment ago).
inline int freePort() {
  return freeListenPorts(1);
}

// A fresh folder for a test's ranks. Removed when the test process exits with every test passed; a failed test's
// folder stays, with its ranks' logs and trace files.
inline std::filesystem::path scratchDir(const std::string& name) {
  static std::vector<std::filesystem::path> made;
  static const bool cleanup = [] {
    return std::atexit([] {
             if (!::testing::UnitTest::GetInstance()->Passed()) return;
             std::error_code ec;
             for (const auto& d : made) std::filesystem::remove_all(d, ec);
           }) == 0;
  }();
  (void)cleanup;
  auto p = std::filesystem::temp_directory_path() / ("tpscope-core-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  made.push_back(p);
  return p;
}

// Runs `world` copies of exe args with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set; kills all at the
// deadline. Each rank's output goes to <dir>/rank-<r>.log and is returned.
inline std::vector<RankResult> runRanks(const std::string& exe, const std::vector<std::string>& args, int world,
                                        const std::filesystem::path& dir, std::chrono::seconds deadline) {
  const int port = freePort();
  std::vector<pid_t> pids(world, -1);
  std::vector<std::string> logs(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string s(*e);
      if (s.rfind("RANK=", 0) == 0 || s.rfind("WORLD_SIZE=", 0) == 0 || s.rfind("LOCAL_RANK=", 0) == 0 ||
          s.rfind("MASTER_ADDR=", 0) == 0 || s.rfind("MASTER_PORT=", 0) == 0 || s.rfind("OMP_NUM_THREADS=", 0) == 0)
        continue;
      env.push_back(s);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> a{exe};
    a.insert(a.end(), args.begin(), args.end());
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    logs[r] = (dir / ("rank-" + std::to_string(r) + ".log")).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pids[r], exe.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0) pids[r] = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  std::vector<RankResult> out(world);
  const auto end = std::chrono::steady_clock::now() + deadline;
  int left = 0;
  for (pid_t p : pids) left += p > 0;
  std::vector<bool> done(world, false);
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[r] || pids[r] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        out[r].exitCode = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < world; ++r)
        if (!done[r] && pids[r] > 0) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          out[r].exitCode = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    out[r].output = ss.str();
  }
  return out;
}

inline std::string describe(const std::vector<RankResult>& rs) {
  std::string s;
  for (size_t r = 0; r < rs.size(); ++r)
    s += "--- rank " + std::to_string(r) + " exit " + std::to_string(rs[r].exitCode) + "\n" + rs[r].output;
  return s;
}

}  // namespace tpscope::testing
