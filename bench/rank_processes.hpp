// For benchmarks that run one process per rank: host a TCP store on a free port, start
// `world` copies of this program with "--rank r --store <url>" plus its own arguments, and
// wait for all of them. The copies recognize --rank and run as that rank.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "store/tcp_store_server.hpp"

extern char** environ;

namespace troupe::bench {

/// Returns 0 when every rank exited with status 0, else 1.
inline int run_self_as_ranks(int argc, char** argv, int world) {
  auto server = tcp_store_server::start({});
  if (!server) {
    std::cerr << server.error() << "\n";
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{argv[0], "--rank", std::to_string(r), "--store", (*server)->url()};
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    std::vector<char*> cargs;
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, cargs.data(), environ) != 0) {
      std::cerr << "could not start rank " << r << "\n";
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      return 1;
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}

}  // namespace troupe::bench
