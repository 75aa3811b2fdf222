// One launched rank: a child process started with posix_spawn, its stdout+stderr going to a log file, in its own
// process group (so a Ctrl-C on the terminal reaches the launcher only and the launcher stops the ranks in order).
//
// Threading: used by the launcher's thread only. Never throws; failures come back as text.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tpscope::cli::capture {

// How a process ended.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit status (signaled == false)
  int signal = 0;  // terminating signal (signaled == true)
  bool ok() const { return !signaled && code == 0; }
  std::string describe() const;  // "exit status 3", "killed by signal SIGABRT"
};

std::string signalName(int sig);  // "SIGABRT", "signal 42"

class RankProcess {
 public:
  // Starts `argv` (argv[0] a path) with exactly `env` ("KEY=VALUE"), output appended to `logFile`.
  // nullopt and `error` set when it cannot start (missing program, no permission, log not writable).
  static std::optional<RankProcess> spawn(int rank, const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env, const std::filesystem::path& logFile,
                                          std::string* error);

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  bool running() const { return !status_.has_value(); }
  const std::optional<ExitStatus>& status() const { return status_; }
  std::chrono::steady_clock::time_point exitedAt() const { return exitedAt_; }

  // Reaps the process if it has ended (waitpid WNOHANG). Returns true when it ended in THIS call.
  bool poll();
  // Sends `sig` if the process is still running.
  void signal(int sig) const;

 private:
  int rank_ = 0;
  pid_t pid_ = -1;
  std::optional<ExitStatus> status_;
  std::chrono::steady_clock::time_point exitedAt_{};
};

// The last `maxLines` lines of a text file ("" if unreadable).
std::string tailOfFile(const std::filesystem::path& file, int maxLines);

}  // namespace tpscope::cli::capture
