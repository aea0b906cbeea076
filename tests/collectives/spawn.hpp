// Child processes for the multi-process collective tests: start rank processes, wait for
// them with a deadline (stragglers are killed), and read their exit status.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace troupe::collectives::testing {

// Starts `args` (args[0] is the program); -1 when it could not be started.
inline pid_t start_process(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Waits for each child until `timeout` in total; children still running then are killed
// and reported as -1. Polls with WNOHANG so that no helper thread outlives the call.
inline std::map<pid_t, int> wait_children(const std::vector<pid_t>& pids,
                                          std::chrono::milliseconds timeout) {
  std::map<pid_t, int> status;
  auto until = std::chrono::steady_clock::now() + timeout;
  while (status.size() < pids.size()) {
    for (pid_t p : pids) {
      if (status.contains(p)) continue;
      int st = 0;
      if (::waitpid(p, &st, WNOHANG) == p) status[p] = st;
    }
    if (status.size() == pids.size()) break;
    if (std::chrono::steady_clock::now() >= until) {
      for (pid_t p : pids)
        if (!status.contains(p)) {
          ::kill(p, SIGKILL);
          int st = 0;
          ::waitpid(p, &st, 0);
          status[p] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

inline bool exited_zero(int st) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0; }

}  // namespace troupe::collectives::testing
