#include "capture/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <deque>

#include <fmt/format.h>

namespace tpscope::cli::capture {

std::string signalName(int sig) {
  switch (sig) {
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGPIPE: return "SIGPIPE";
    case SIGHUP: return "SIGHUP";
    default: return fmt::format("signal {}", sig);
  }
}

std::string ExitStatus::describe() const {
  if (signaled) return fmt::format("killed by signal {}", signalName(signal));
  return fmt::format("exit status {}", code);
}

std::optional<RankProcess> RankProcess::spawn(int rank, const std::vector<std::string>& argv,
                                              const std::vector<std::string>& env,
                                              const std::filesystem::path& logFile, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<RankProcess> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  if (argv.empty()) return fail("no program to start");
  const int logFd = ::open(logFile.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logFd < 0) return fail(fmt::format("cannot write {}: {}", logFile.string(), strerror(errno)));
  const int nullFd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (nullFd >= 0) posix_spawn_file_actions_adddup2(&actions, nullFd, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, logFd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, logFd, STDERR_FILENO);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group (pgid = its pid): terminal signals reach the launcher only. Default dispositions and an empty
  // signal mask, whatever the launcher has blocked or ignored.
  sigset_t defaults, empty;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGPIPE, SIGHUP, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(logFd);
  if (nullFd >= 0) ::close(nullFd);
  if (rc != 0) return fail(fmt::format("cannot start {}: {}", argv[0], strerror(rc)));

  RankProcess p;
  p.rank_ = rank;
  p.pid_ = pid;
  return p;
}

bool RankProcess::poll() {
  if (status_) return false;
  int st = 0;
  const pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r != pid_) return false;
  ExitStatus s;
  if (WIFSIGNALED(st)) {
    s.signaled = true;
    s.signal = WTERMSIG(st);
  } else {
    s.code = WEXITSTATUS(st);
  }
  status_ = s;
  exitedAt_ = std::chrono::steady_clock::now();
  return true;
}

void RankProcess::signal(int sig) const {
  if (!status_ && pid_ > 0) ::kill(pid_, sig);
}

std::string tailOfFile(const std::filesystem::path& file, int maxLines) {
  std::ifstream in(file);
  if (!in) return {};
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(std::move(line));
    if (static_cast<int>(lines.size()) > maxLines) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace tpscope::cli::capture
