#include <troupe/launcher/worker_group.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <troupe/core/log.hpp>
#include <troupe/launcher/config.hpp>

namespace troupe::launcher {

namespace {

constexpr std::size_t tail_bytes = 8192;

void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

int open_pidfd(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string worker_exit::describe() const {
  if (!signaled) return strcat("exit code ", code);
  const char* name = ::sigabbrev_np(code);
  return strcat("signal ", code, name != nullptr ? strcat(" (SIG", name, ")") : std::string());
}

struct worker_group::worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  int pidfd = -1;
  /// The worker's watchdog (in the worker's process group) and the write end of its guard
  /// pipe: when the pipe closes, because troupe-run closed it or died however it died, the
  /// watchdog SIGKILLs the whole group, grandchildren included.
  pid_t watchdog = -1;
  int guard = -1;
  bool exited = false;
  int status = 0;
  struct stream {
    int pipe = -1;
    int file = -1;
    int console = -1;  // 1 or 2 when copied to the launcher's console
    std::string partial;
  } out, err;
  std::string tail;

  void copy(stream& s, const char* data, std::size_t n) {
    if (s.file >= 0) write_all(s.file, data, n);
    if (&s == &err) {
      tail.append(data, n);
      if (tail.size() > tail_bytes) tail.erase(0, tail.size() - tail_bytes);
    }
    if (s.console < 0) return;
    s.partial.append(data, n);
    std::size_t start = 0;
    std::string lines;
    for (auto nl = s.partial.find('\n'); nl != std::string::npos;
         nl = s.partial.find('\n', start)) {
      lines += strcat('[', rank, "]: ");
      lines.append(s.partial, start, nl + 1 - start);
      start = nl + 1;
    }
    s.partial.erase(0, start);
    if (!lines.empty()) write_all(s.console, lines.data(), lines.size());
  }

  // Reads what is available; closes the pipe at end of file.
  void drain(stream& s) {
    char buf[65536];
    while (s.pipe >= 0) {
      auto n = ::read(s.pipe, buf, sizeof buf);
      if (n > 0) {
        copy(s, buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      finish(s);
    }
  }

  void finish(stream& s) {
    close_fd(s.pipe);
    if (s.console >= 0 && !s.partial.empty()) {
      std::string line = strcat('[', rank, "]: ", s.partial, '\n');
      write_all(s.console, line.data(), line.size());
      s.partial.clear();
    }
  }

  ~worker() {
    drain(out);
    drain(err);
    finish(out);
    finish(err);
    close_fd(out.file);
    close_fd(err.file);
    close_fd(pidfd);
    close_fd(guard);
  }
};

worker_group::worker_group() = default;

worker_group::~worker_group() {
  if (!workers_.empty()) stop(SIGKILL, duration::zero());
}

namespace {

// Forks the watchdog of the worker `pid` (whose process group is `pid`): it joins that group,
// ignores the polite stop signals sent to it, and waits for EOF on `guard_read`; then it
// SIGKILLs its group, itself included. Returns its pid, or -1 (the worker then runs without
// one, as before). Only async-signal-safe calls in the child.
pid_t start_watchdog(pid_t pid, int guard_read) {
  const pid_t w = ::fork();
  if (w != 0) return w;
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2})
    ::signal(sig, SIG_IGN);
  if (::setpgid(0, pid) != 0) ::_exit(0);  // the group is gone already: nothing to guard
  if (guard_read != 3) {
    ::dup2(guard_read, 3);
  }
  ::syscall(SYS_close_range, 0U, 2U, 0U);
  ::syscall(SYS_close_range, 4U, ~0U, 0U);
  char c = 0;
  for (;;) {
    const ssize_t n = ::read(3, &c, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::kill(0, SIGKILL);
  ::_exit(0);
}

}  // namespace

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return program;
}

expected<void> worker_group::start(std::vector<worker_spec> specs) {
  for (auto& spec : specs) {
    auto w = launch(spec);
    if (!w) {
      stop(SIGKILL, duration::zero());
      return std::move(w).error();
    }
    workers_.push_back(std::move(*w));
  }
  return ok();
}

expected<void> worker_group::replace(std::size_t index, worker_spec spec) {
  if (index >= workers_.size())
    return make_error(errc::invalid_argument, "no worker at index ", index, " of ",
                      workers_.size());
  auto& old = workers_[index];
  if (!old->exited)
    return make_error(errc::invalid_argument, "worker rank ", old->rank, " (pid ", old->pid,
                      ") still runs; only an exited worker is replaced");
  retire(*old);
  auto w = launch(spec);
  if (!w) return std::move(w).error();
  old = std::move(*w);
  return ok();
}

void worker_group::retire(worker& w) {
  // Whatever the dead worker started in its process group goes with it, then its watchdog.
  ::kill(-w.pid, SIGKILL);
  close_fd(w.guard);
  if (w.watchdog > 0) {
    ::kill(w.watchdog, SIGKILL);
    while (::waitpid(w.watchdog, nullptr, 0) < 0 && errno == EINTR) {
    }
    w.watchdog = -1;
  }
}

expected<std::unique_ptr<worker_group::worker>> worker_group::launch(const worker_spec& spec) {
  const pid_t parent = ::getpid();
  auto w = std::make_unique<worker>();
  w->local_rank = spec.local_rank;
  w->rank = spec.rank;
  std::error_code ec;
  std::filesystem::create_directories(spec.log_dir, ec);
  if (ec) {
    return make_error(errc::unavailable, "cannot create the log folder '", spec.log_dir,
                      "': ", ec.message());
  }
  w->out.file =
      ::open((spec.log_dir + "/stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  w->err.file =
      ::open((spec.log_dir + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->out.file < 0 || w->err.file < 0) {
    const int open_errno = errno;
    return make_error(errc::unavailable, "cannot create the log files in '", spec.log_dir,
                      "': ", std::strerror(open_errno));
  }
  auto on_console = [&](int bit) { return (spec.tee & bit) != 0 || (spec.redirect & bit) == 0; };
  w->out.console = on_console(stream_stdout) ? 1 : -1;
  w->err.console = on_console(stream_stderr) ? 2 : -1;
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    return make_error(errc::unavailable, "pipe: ", std::strerror(errno));
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return make_error(errc::unavailable, "pipe: ", std::strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::string path = resolve_program(spec.program);
  if (::access(path.c_str(), X_OK) != 0) {
    const int access_errno = errno;
    return make_error(errc::invalid_argument, "cannot execute the worker program '", spec.program,
                      "': ", std::strerror(access_errno),
                      spec.program.find('/') == std::string::npos ? " (searched PATH)" : "");
  }
  std::vector<char*> argv{const_cast<char*>(spec.program.c_str())};
  for (const auto& a : spec.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::syscall(SYS_close_range, 3U, ~0U, 0U);
    ::execve(path.c_str(), argv.data(), envp.data());
    const char msg[] = "troupe-run: cannot execute the worker program\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return make_error(errc::unavailable, "cannot start worker rank ", spec.rank,
                      ": fork: ", std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  w->pid = pid;
  if (int guard[2]; ::pipe2(guard, O_CLOEXEC) == 0) {
    w->watchdog = start_watchdog(pid, guard[0]);
    ::close(guard[0]);
    if (w->watchdog > 0) {
      w->guard = guard[1];
    } else {
      ::close(guard[1]);
    }
  }
  w->pidfd = open_pidfd(pid);
  w->out.pipe = out_pipe[0];
  w->err.pipe = err_pipe[0];
  ::fcntl(w->out.pipe, F_SETFL, O_NONBLOCK);
  ::fcntl(w->err.pipe, F_SETFL, O_NONBLOCK);
  return w;
}

bool worker_group::pump(duration timeout, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<worker*, worker::stream*>> owners;
  if (wake_fd >= 0) {
    fds.push_back({wake_fd, POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
  }
  bool have_pidfds = true;
  for (auto& w : workers_) {
    for (auto* s : {&w->out, &w->err}) {
      if (s->pipe < 0) continue;
      fds.push_back({s->pipe, POLLIN, 0});
      owners.emplace_back(w.get(), s);
    }
    if (!w->exited) {
      if (w->pidfd >= 0) {
        fds.push_back({w->pidfd, POLLIN, 0});
        owners.emplace_back(w.get(), nullptr);
      } else {
        have_pidfds = false;
      }
    }
  }
  // Without pidfds an exit shows only through SIGCHLD on the wake pipe; look again soon.
  if (!have_pidfds) timeout = std::min(timeout, duration(20));
  int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (n <= 0) return false;
  bool woken = false;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    auto [w, s] = owners[i];
    if (w == nullptr) {
      woken = true;
    } else if (s != nullptr) {
      w->drain(*s);
    }
  }
  return woken;
}

namespace {

// The last `max_lines` lines of `text`.
std::string last_lines(std::string_view text, int max_lines) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  std::size_t start = text.size();
  for (int i = 0; i < max_lines; ++i) {
    auto nl = start == 0 ? std::string_view::npos : text.rfind('\n', start - 1);
    if (nl == std::string_view::npos) return std::string(text);
    start = nl;
  }
  return std::string(text.substr(start + 1));
}

}  // namespace

worker_exit worker_group::collect(worker& w, int status) {
  w.exited = true;
  w.status = status;
  close_fd(w.pidfd);
  w.drain(w.out);
  w.drain(w.err);
  worker_exit e;
  e.local_rank = w.local_rank;
  e.rank = w.rank;
  e.pid = w.pid;
  e.signaled = WIFSIGNALED(status);
  e.code = e.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  e.stderr_tail = last_lines(w.tail, 20);
  return e;
}

std::vector<worker_exit> worker_group::reap() {
  std::vector<worker_exit> out;
  for (auto& w : workers_) {
    if (w->exited) continue;
    int status = 0;
    if (::waitpid(w->pid, &status, WNOHANG) == w->pid) out.push_back(collect(*w, status));
  }
  return out;
}

std::size_t worker_group::running() const {
  std::size_t n = 0;
  for (const auto& w : workers_) n += w->exited ? 0 : 1;
  return n;
}

std::size_t worker_group::size() const { return workers_.size(); }

std::vector<pid_t> worker_group::pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_) out.push_back(w->pid);
  return out;
}

std::vector<worker_exit> worker_group::stop(int sig, duration grace,
                                            const std::function<bool()>& hurry) {
  for (auto& w : workers_) {
    if (w->exited) continue;
    ::kill(-w->pid, sig);
    ::kill(w->pid, sig);
  }
  auto exits = reap();
  const auto until = deadline::after(grace);
  while (running() > 0 && !until.expired() && !(hurry && hurry())) {
    // Short waits so that `hurry` is looked at while the workers take their time.
    pump(std::min(until.remaining(), duration(50)), -1);
    auto more = reap();
    exits.insert(exits.end(), more.begin(), more.end());
  }
  // Whatever is left, and anything the workers started in their process groups (their
  // watchdogs included; closing the guard alone would do it too, but not at once).
  for (auto& w : workers_) ::kill(-w->pid, SIGKILL);
  for (auto& w : workers_) {
    close_fd(w->guard);
    if (w->watchdog > 0) {
      ::kill(w->watchdog, SIGKILL);  // in case it had not joined the group yet
      while (::waitpid(w->watchdog, nullptr, 0) < 0 && errno == EINTR) {
      }
      w->watchdog = -1;
    }
  }
  for (auto& w : workers_) {
    if (w->exited) continue;
    int status = 0;
    pid_t r = -1;
    do {
      r = ::waitpid(w->pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    exits.push_back(collect(*w, r == w->pid ? status : 0));
  }
  workers_.clear();
  return exits;
}

}  // namespace troupe::launcher
