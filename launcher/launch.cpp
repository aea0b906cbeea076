#include <troupe/launcher/launch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <utility>

#include <troupe/launcher/agent.hpp>
#include <troupe/launcher/worker_env.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace troupe {

namespace {

struct child {
  int rank = 0;
  pid_t pid = -1;
  int pidfd = -1;
  int msg_fd = -1;
  std::string message;
  bool done = false;
  int status = 0;
};

// The embedded store lives in a process of its own, forked before any thread exists
// here: a child forked from a multi-threaded process may deadlock on a lock (the
// allocator's, a logger's) that another thread held at the moment of the fork, so the
// workers must be forked from a process without an I/O thread. The host exits when its
// lifeline pipe closes, that is when launch() returns or this process dies.
class store_host {
 public:
  static expected<store_host> start(duration timeout, const std::string& secret) {
    int port_pipe[2], lifeline[2];
    if (::pipe2(port_pipe, O_CLOEXEC) != 0) return sys_error("pipe");
    if (::pipe2(lifeline, O_CLOEXEC) != 0) {
      ::close(port_pipe[0]);
      ::close(port_pipe[1]);
      return sys_error("pipe");
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(port_pipe[0]);
      ::close(lifeline[1]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      tcp_store_server_options so;
      so.secret = secret;
      so.tls = tls_config_from_env();
      auto server = tcp_store_server::start(so);
      std::string reply =
          server ? std::to_string((*server)->port()) : "!" + server.error().to_string();
      [[maybe_unused]] auto w = ::write(port_pipe[1], reply.data(), reply.size());
      ::close(port_pipe[1]);
      char b;
      while (::read(lifeline[0], &b, 1) != 0 && errno == EINTR) {
      }
      if (server) (*server)->shutdown(std::chrono::seconds(2));
      ::_exit(server ? 0 : 1);
    }
    ::close(port_pipe[1]);
    ::close(lifeline[0]);
    if (pid < 0) {
      ::close(port_pipe[0]);
      ::close(lifeline[1]);
      return sys_error("fork");
    }
    store_host host(pid, lifeline[1]);
    std::string reply;
    auto until = deadline::after(timeout);
    char buf[512];
    for (;;) {
      pollfd p{port_pipe[0], POLLIN, 0};
      int ms = static_cast<int>(std::min<long long>(until.remaining().count(), 1 << 30));
      if (::poll(&p, 1, ms) <= 0 && until.expired()) break;
      auto n = ::read(port_pipe[0], buf, sizeof buf);
      if (n > 0)
        reply.append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR)
        break;
    }
    ::close(port_pipe[0]);
    if (reply.empty() || reply[0] == '!')
      return make_error(errc::unavailable, "launch: the embedded store did not start",
                        reply.empty() ? std::string(" in time") : ": " + reply.substr(1));
    host.port_ = std::atoi(reply.c_str());
    return host;
  }

  store_host(store_host&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        lifeline_(std::exchange(o.lifeline_, -1)),
        port_(o.port_) {}
  store_host& operator=(store_host&&) = delete;
  ~store_host() {
    if (lifeline_ >= 0) ::close(lifeline_);
    if (pid_ > 0) {
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

 private:
  store_host(pid_t pid, int lifeline) : pid_(pid), lifeline_(lifeline) {}
  static error sys_error(const char* what) {
    return make_error(errc::unavailable, "launch: ", what, ": ", std::strerror(errno));
  }
  pid_t pid_ = -1;
  int lifeline_ = -1;
  int port_ = 0;
};

void read_message(child& c) {
  char buf[4096];
  while (c.msg_fd >= 0) {
    auto n = ::read(c.msg_fd, buf, sizeof buf);
    if (n > 0) {
      c.message.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ::close(c.msg_fd);
    c.msg_fd = -1;
  }
}

expected<void> run_guarded(const std::function<expected<void>()>& fn) {
  try {
    return fn();
  } catch (const troupe::exception& e) {
    return e.err();
  } catch (const std::exception& e) {
    return make_error(errc::user_error, e.what());
  } catch (...) {
    return make_error(errc::user_error, "an exception that is not a std::exception");
  }
}

// What the caller sees of a child's error: the text alone for user errors, with the
// code for troupe's own.
std::string error_text(const error& e) {
  return e.code() == errc::user_error && e.worker().empty() && e.operation().empty()
             ? e.message()
             : e.to_string();
}

launcher::worker_assignment assignment(const launch_config& c, int rank, int port,
                                       const std::string& run_id, const std::string& url,
                                       const std::string& secret = {}) {
  launcher::worker_assignment a;
  a.local_rank = a.rank = a.role_rank = rank;
  a.local_world_size = a.world_size = a.role_world_size = c.nprocs;
  a.master_addr = c.master_addr;
  a.master_port = port;
  a.run_id = run_id;
  a.store_url = url;
  if (!url.empty()) a.store_prefix = "launch/" + run_id;
  a.secret = secret;
  return a;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::sigabbrev_np(WTERMSIG(status));
    return strcat("was killed by signal ", WTERMSIG(status),
                  name != nullptr ? strcat(" (SIG", name, ")") : std::string());
  }
  return strcat("exited with code ", WEXITSTATUS(status));
}

}  // namespace

expected<void> detail::launch_impl(const std::function<expected<void>()>& fn,
                                   const launch_config& c) {
  if (c.nprocs < 1)
    return make_error(errc::invalid_argument, "launch: nprocs is ", c.nprocs,
                      "; it must be at least 1");
  const std::string run_id = c.run_id.empty() ? launcher::fresh_run_id() : c.run_id;
  const int port = c.master_port > 0 ? c.master_port : launcher::pick_free_port();

  if (c.nprocs == 1) {
    auto vars = launcher::worker_environment(assignment(c, 0, port, run_id, ""), false);
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved.emplace_back(k, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k.c_str(), v.c_str(), 1);
    }
    auto result = run_guarded(fn);
    for (const auto& [k, v] : saved) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
    if (!result) return make_error(errc::user_error, "rank 0 failed: ", error_text(result.error()));
    return ok();
  }

  std::optional<store_host> host;
  std::string url;
  std::string secret;
  if (c.start_store) {
    // The store of this launch admits its own processes only: the caller's secret when it
    // has one, else a fresh one.
    secret = job_secret_from_env();
    if (secret.empty()) {
      auto fresh = make_job_secret();
      if (!fresh) return std::move(fresh).error();
      secret = std::move(*fresh);
    }
    auto h = store_host::start(std::chrono::seconds(30), secret);
    if (!h) return std::move(h).error();
    host.emplace(std::move(*h));
    url = host->url();
  }

  std::vector<child> children(static_cast<std::size_t>(c.nprocs));
  auto kill_all = [&](int sig) {
    for (auto& ch : children)
      if (ch.pid > 0 && !ch.done) ::kill(-ch.pid, sig);
  };
  auto reap_all = [&] {
    for (auto& ch : children) {
      if (ch.pid <= 0 || ch.done) continue;
      while (::waitpid(ch.pid, &ch.status, 0) < 0 && errno == EINTR) {
      }
      ch.done = true;
      if (ch.pidfd >= 0) ::close(ch.pidfd);
      if (ch.msg_fd >= 0) ::close(ch.msg_fd);
    }
  };

  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  for (int rank = 0; rank < c.nprocs; ++rank) {
    auto& ch = children[static_cast<std::size_t>(rank)];
    ch.rank = rank;
    auto vars = launcher::worker_environment(assignment(c, rank, port, run_id, url, secret),
                                             launcher::should_limit_omp_threads(c.nprocs));
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      kill_all(SIGKILL);
      reap_all();
      return make_error(errc::unavailable, "launch: pipe: ", std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      // The caller's handlers (a test framework's, say) must not keep a child alive
      // when it is told to stop.
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
      auto result = run_guarded(fn);
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      if (result) ::_exit(0);
      std::string text = error_text(result.error());
      [[maybe_unused]] auto n = ::write(fds[1], text.data(), text.size());
      ::_exit(1);
    }
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      kill_all(SIGKILL);
      reap_all();
      return make_error(errc::unavailable, "launch: fork: ", std::strerror(errno));
    }
    ::setpgid(pid, pid);
    ch.pid = pid;
    ch.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    ch.msg_fd = fds[0];
    ::fcntl(ch.msg_fd, F_SETFL, O_NONBLOCK);
  }

  // Watch until all are done or one fails.
  const child* failed = nullptr;
  std::size_t left = children.size();
  while (left > 0 && failed == nullptr) {
    std::vector<pollfd> fds;
    for (auto& ch : children) {
      if (ch.done) continue;
      if (ch.pidfd >= 0) fds.push_back({ch.pidfd, POLLIN, 0});
      if (ch.msg_fd >= 0) fds.push_back({ch.msg_fd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), 20);
    for (auto& ch : children) {
      if (ch.done) continue;
      read_message(ch);
      if (::waitpid(ch.pid, &ch.status, WNOHANG) != ch.pid) continue;
      ch.done = true;
      --left;
      if (ch.pidfd >= 0) ::close(ch.pidfd);
      read_message(ch);
      if (ch.msg_fd >= 0) ::close(ch.msg_fd);
      ch.msg_fd = -1;
      if ((WIFEXITED(ch.status) && WEXITSTATUS(ch.status) == 0) || failed != nullptr) continue;
      failed = &ch;
    }
  }
  if (failed == nullptr) return ok();

  kill_all(SIGTERM);
  const auto until = deadline::after(c.stop_grace);
  for (bool any = true; any && !until.expired();) {
    any = false;
    for (auto& ch : children) {
      if (ch.done) continue;
      if (::waitpid(ch.pid, &ch.status, WNOHANG) == ch.pid) {
        ch.done = true;
        if (ch.pidfd >= 0) ::close(ch.pidfd);
        if (ch.msg_fd >= 0) ::close(ch.msg_fd);
      } else {
        any = true;
        if (ch.pidfd >= 0) {
          pollfd p{ch.pidfd, POLLIN, 0};
          ::poll(&p, 1, static_cast<int>(std::min<long>(until.remaining().count(), 50)));
        }
      }
    }
  }
  kill_all(SIGKILL);
  reap_all();
  if (!failed->message.empty())
    return make_error(errc::user_error, "rank ", failed->rank, " failed: ", failed->message);
  return make_error(errc::user_error, "rank ", failed->rank, " ", describe_status(failed->status));
}

}  // namespace troupe
