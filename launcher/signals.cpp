#include <troupe/launcher/signals.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace troupe::launcher {

namespace {

int pipe_fds[2] = {-1, -1};
std::atomic<int> first_stop{0};
std::atomic<int> stop_count{0};
constexpr int handled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    int none = 0;
    first_stop.compare_exchange_strong(none, sig);
    stop_count.fetch_add(1);
  }
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(pipe_fds[1], &byte, 1);
  errno = saved;
}

}  // namespace

expected<int> install_signal_pipe() {
  if (pipe_fds[0] >= 0) return pipe_fds[0];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0)
    return make_error(errc::unavailable, "cannot create the signal pipe: ", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : handled) ::sigaction(sig, &sa, nullptr);
  // A worker's pipe closing must not kill the launcher.
  ::signal(SIGPIPE, SIG_IGN);
  return pipe_fds[0];
}

signal_events drain_signal_pipe() {
  signal_events ev;
  unsigned char buf[64];
  for (;;) {
    auto n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == SIGCHLD) {
        ev.child = true;
      } else {
        ev.stop = buf[i];
      }
    }
  }
  return ev;
}

int stop_signal_received() noexcept { return first_stop.load(); }

int stop_signal_count() noexcept { return stop_count.load(); }

void restore_signal_handlers() {
  for (int sig : handled) ::signal(sig, SIG_DFL);
}

}  // namespace troupe::launcher
