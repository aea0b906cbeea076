// child_process: the one way tests and benchmarks start programs. A child is started with
// fork and exec, optionally with more environment and with its output in a file, and it
// never outlives its handle (nor, by default, the thread that started it: PR_SET_PDEATHSIG),
// so a failed or killed test leaves no process behind.
//
//   auto p = troupe::test::child_process::start({prog, "--flag"}, {.output = "out.txt"});
//   if (!p.started()) FAIL(p.start_error());
//   CHECK(p.wait(10s));          // false: it was still running and got SIGKILL
//   CHECK(p.exit_code() == 0);
//
// start_forked(fn) is the same handle over a fork that runs `fn` instead of a program (a
// raw TCP echo server next to a benchmark, say).
//
// Every wait is bounded; a child still running at its deadline is killed and reaped.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace troupe::test {

struct spawn_options {
  /// "NAME=value" set on top of this process's environment; "NAME" alone removes NAME.
  std::vector<std::string> env{};
  /// The child's environment is `env` alone, not this process's plus `env`.
  bool replace_env = false;
  /// stdout and stderr go to this file (created or truncated); empty: inherited.
  std::string output{};
  /// Without `output`: the child's stdout is this descriptor (e.g. a pipe's write end).
  int stdout_fd = -1;
  /// The child's stdin is this descriptor (e.g. a pipe's read end); -1: inherited. Open the
  /// pipe with O_CLOEXEC, so that the child does not also hold its other end.
  int stdin_fd = -1;
  /// The child gets SIGKILL when the thread that started it ends (start children from a
  /// thread that outlives them, normally the test's own).
  bool die_with_parent = true;
};

namespace detail {

// This process's environment with `changes` applied.
inline std::vector<std::string> environment_with(const std::vector<std::string>& changes) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  for (const auto& c : changes) {
    const auto eq = c.find('=');
    const std::string name = c.substr(0, eq) + "=";
    std::erase_if(out, [&](const std::string& v) { return v.rfind(name, 0) == 0; });
    if (eq != std::string::npos) out.push_back(c);
  }
  return out;
}

}  // namespace detail

/// Starts `argv` (argv[0] a path, or a name looked up on PATH). Returns the pid, or -1 with
/// the reason in `why`. The caller owns the pid: wait for it (wait_processes) or kill it.
inline pid_t spawn_process(const std::vector<std::string>& argv, const spawn_options& o,
                           std::string* why = nullptr) {
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return pid_t{-1};
  };
  if (argv.empty() || argv[0].empty()) return fail("no program to start");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env = o.replace_env ? o.env : detail::environment_with(o.env);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out_fd = -1;
  if (!o.output.empty()) {
    out_fd = ::open(o.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) return fail("cannot open " + o.output + ": " + std::strerror(errno));
  }
  // The child reports a failed exec through this pipe (closed on a successful exec).
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    if (out_fd >= 0) ::close(out_fd);
    return fail(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    if (o.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    if (out_fd >= 0) {
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(out_fd, STDERR_FILENO);
    } else if (o.stdout_fd >= 0) {
      ::dup2(o.stdout_fd, STDOUT_FILENO);
    }
    if (o.stdin_fd >= 0) ::dup2(o.stdin_fd, STDIN_FILENO);
    if (argv[0].find('/') == std::string::npos)
      ::execvpe(args[0], args.data(), envp.data());
    else
      ::execve(args[0], args.data(), envp.data());
    const int e = errno;
    [[maybe_unused]] auto n = ::write(report[1], &e, sizeof e);
    ::_exit(127);
  }
  if (out_fd >= 0) ::close(out_fd);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    return fail(std::string("fork: ") + std::strerror(errno));
  }
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    ::waitpid(pid, nullptr, 0);
    return fail("cannot run " + argv[0] + ": " + std::strerror(exec_errno));
  }
  return pid;
}

/// Waits for every pid, at most `timeout` in all; those still running then are killed and
/// reported as -1. The others map to their wait status. Polls, so no thread outlives it.
inline std::map<pid_t, int> wait_processes(const std::vector<pid_t>& pids,
                                           std::chrono::milliseconds timeout) {
  std::map<pid_t, int> status;
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (pid_t p : pids) {
      int st = 0;
      if (!status.contains(p) && ::waitpid(p, &st, WNOHANG) == p) status[p] = st;
    }
    if (status.size() == pids.size()) return status;
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t p : pids)
    if (!status.contains(p)) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      status[p] = -1;
    }
  return status;
}

/// Whether a wait status (as wait_processes reports it) is a clean exit with code 0.
inline bool exited_zero(int status) {
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// One child that is gone when its handle is.
class child_process {
 public:
  child_process() = default;
  child_process(child_process&& other) noexcept { *this = std::move(other); }
  child_process& operator=(child_process&& other) noexcept {
    if (this != &other) {
      stop();
      pid_ = std::exchange(other.pid_, -1);
      reaped_ = std::exchange(other.reaped_, false);
      status_ = other.status_;
      output_ = std::move(other.output_);
      error_ = std::move(other.error_);
    }
    return *this;
  }
  ~child_process() { stop(); }

  static child_process start(const std::vector<std::string>& argv, const spawn_options& o = {}) {
    child_process c;
    c.output_ = o.output;
    c.pid_ = spawn_process(argv, o, &c.error_);
    return c;
  }

  /// Forks a child that runs `fn` and exits with what it returns (127 if it throws), with
  /// start()'s guarantees: it never outlives the handle and, with `die_with_parent`, dies
  /// with the thread that started it. The child is a copy of this process with only this
  /// thread: where other threads run, `fn` may call async-signal-safe functions only (no
  /// allocation, no locks). Never blocks; a failed fork is reported by start_error().
  static child_process start_forked(const std::function<int()>& fn, bool die_with_parent = true) {
    child_process c;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (die_with_parent) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
      }
      int code = 127;
      try {
        code = fn();
      } catch (...) {
      }
      ::_exit(code);
    }
    if (pid < 0)
      c.error_ = std::string("fork: ") + std::strerror(errno);
    else
      c.pid_ = pid;
    return c;
  }

  bool started() const noexcept { return pid_ > 0; }
  /// Why start() failed.
  const std::string& start_error() const noexcept { return error_; }
  pid_t pid() const noexcept { return pid_; }

  /// Whether it has exited (reaping it if so). Never blocks.
  bool exited() {
    if (reaped_ || pid_ <= 0) return true;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  /// Waits until it exits, at most `timeout`; then kills it. True if it exited by itself.
  bool wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!exited()) {
      if (std::chrono::steady_clock::now() >= until) {
        stop();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  /// Sends `sig` while it runs.
  void signal(int sig) {
    if (!exited()) ::kill(pid_, sig);
  }
  /// SIGKILL and reap, when it still runs.
  void stop() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      reaped_ = true;
    }
  }

  /// The wait status (valid once exited()).
  int status() const noexcept { return status_; }
  /// Its exit code, or -1 when it has not exited normally (running, killed by a signal).
  int exit_code() const noexcept {
    return reaped_ && WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  }
  /// The signal that ended it, or 0.
  int term_signal() const noexcept {
    return reaped_ && WIFSIGNALED(status_) ? WTERMSIG(status_) : 0;
  }
  /// What it wrote to its output file so far ("" without one).
  std::string output_text() const {
    if (output_.empty()) return {};
    std::ifstream in(output_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string output_;
  std::string error_;
};

}  // namespace troupe::test
