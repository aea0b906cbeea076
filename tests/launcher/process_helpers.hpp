// Helpers for the troupe-run tests: start troupe-run with its output in a file, wait for
// conditions with a deadline, read the workers' records.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "support/child_process.hpp"

namespace launcher_test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

/// A fresh folder for one test.
inline fs::path fresh_dir(const std::string& name) {
  auto dir =
      fs::temp_directory_path() / ("troupe-launcher-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// A started troupe-run (tests/support/child_process.hpp); killed (SIGKILL) if the test
/// leaves it running.
struct launcher_process {
  troupe::test::child_process proc;
  pid_t pid = -1;

  /// Waits for it to exit (at most `timeout`; killed after that). True if it exited.
  bool wait(std::chrono::milliseconds timeout) { return proc.wait(timeout); }
  int exit_code() const { return proc.exit_code(); }
  int status() const { return proc.status(); }
  std::string text() const { return proc.output_text(); }
};

/// Starts `args` (args[0] a path) with stdout and stderr going to `output`.
inline std::unique_ptr<launcher_process> start(const std::vector<std::string>& args,
                                               const fs::path& output) {
  auto p = std::make_unique<launcher_process>();
  p->proc = troupe::test::child_process::start(args, {.output = output.string()});
  REQUIRE_MESSAGE(p->proc.started(), p->proc.start_error());
  p->pid = p->proc.pid();
  return p;
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = 20s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

using record = std::map<std::string, std::string>;

/// Reads DIR/round<R>.rank<N> written by launcher_test_worker.
inline record read_record(const fs::path& file) {
  record r;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) r[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return r;
}

/// The records of round `round` present now, by rank.
inline std::map<int, record> records_of_round(const fs::path& dir, int round) {
  std::map<int, record> out;
  const std::string prefix = "round" + std::to_string(round) + ".rank";
  for (const auto& e : fs::directory_iterator(dir)) {
    auto name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.ends_with(".tmp")) continue;
    out[std::stoi(name.substr(prefix.size()))] = read_record(e.path());
  }
  return out;
}

/// Whether a process with this pid still runs (a zombie waiting for its new parent to
/// reap it counts as gone).
inline bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

}  // namespace launcher_test
