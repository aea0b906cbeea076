// worker_group: this node's workers for one attempt. Starts them (fork + exec, each in
// its own process group, killed by the kernel if the launcher dies), pumps their output
// into per-rank log files and, unless redirected, onto the console with a rank prefix,
// reaps them, and stops them (SIGTERM to each process group, SIGKILL after a grace
// period). Single-threaded: the launcher's loop calls pump() and reap().
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe::launcher {

struct worker_spec {
  int local_rank = 0;
  int rank = 0;
  /// Absolute path (or a name looked up in PATH) and arguments (argv[0] not included).
  std::string program;
  std::vector<std::string> args;
  /// The complete environment, "K=V".
  std::vector<std::string> env;
  /// Folder receiving "stdout" and "stderr" (created if missing).
  std::string log_dir;
  /// stream_stdout / stream_stderr bits: kept off the console (redirects) ...
  int redirect = 0;
  /// ... or explicitly copied to it (tee); tee wins over redirect.
  int tee = 0;
};

/// How a worker ended.
struct worker_exit {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  /// Exit code, or the signal when `signaled`.
  int code = 0;
  bool signaled = false;
  /// The last lines of its stderr.
  std::string stderr_tail;
  bool failed() const noexcept { return signaled || code != 0; }
  /// "exit code 3" or "signal 9 (SIGKILL)".
  std::string describe() const;
};

class worker_group {
 public:
  worker_group();
  ~worker_group();  // kills and reaps whatever still runs
  worker_group(const worker_group&) = delete;
  worker_group& operator=(const worker_group&) = delete;

  /// Starts one process per spec. On failure nothing is left running.
  expected<void> start(std::vector<worker_spec> specs);

  /// Starts `spec` in place of the worker at `index` (the order of start's specs), which
  /// must have exited and been reaped: what it left in its process group is killed, and
  /// the others keep running. On failure the slot keeps the exited worker.
  expected<void> replace(std::size_t index, worker_spec spec);

  /// Waits up to `timeout` for output, or for `wake_fd` to become readable (then returns
  /// true), copying whatever output arrives.
  bool pump(duration timeout, int wake_fd);

  /// Collects workers that have exited since the last call (non-blocking).
  std::vector<worker_exit> reap();

  /// Workers not yet reaped.
  std::size_t running() const;
  std::size_t size() const;
  std::vector<pid_t> pids() const;

  /// Sends `sig` to every running worker's process group, waits up to `grace` (copying
  /// output; cut short as soon as `hurry` returns true), then SIGKILLs what is left and
  /// reaps everything. Returns the exits collected meanwhile.
  std::vector<worker_exit> stop(int sig, duration grace, const std::function<bool()>& hurry = {});

 private:
  struct worker;
  // Starts one worker; nothing of it is left on failure.
  expected<std::unique_ptr<worker>> launch(const worker_spec& spec);
  // Kills what an exited worker left in its process group, and its watchdog.
  void retire(worker& w);
  worker_exit collect(worker& w, int status);
  std::vector<std::unique_ptr<worker>> workers_;
};

/// Looks `program` up in PATH when it has no '/'; returns it unchanged if not found.
std::string resolve_program(const std::string& program);

}  // namespace troupe::launcher
