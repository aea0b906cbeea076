#include <troupe/collectives/gloo/os_tuning.hpp>

#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include <dirent.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>

#include <troupe/collectives/gloo/local_sockets.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/log.hpp>

namespace troupe::collectives::gloo_os {

// Gloo's TCP transport writes with writev, so a peer that died makes the write raise
// SIGPIPE, whose default action kills the whole process; the survivors must get EPIPE and
// fail the operation instead. Once per process, a SIGPIPE left at its default action is
// set to ignored (a handler the program installed is kept).
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      ::sigemptyset(&ignore.sa_mask);
      (void)::sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

// The ids of this process's threads, sorted.
std::vector<pid_t> thread_ids() {
  std::vector<pid_t> out;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Gloo's TCP device runs one event-loop thread that polls its sockets level-triggered and
// only try-locks a connection, spinning in epoll_wait while another thread holds the lock.
// When that thread (our worker, inside a send or receive) is preempted by the loop
// thread's own wake-up, the loop spins on the CPU the lock holder waits for, often until
// the next scheduler tick (4 ms at HZ=250). SCHED_BATCH (same weight, no privilege
// needed) keeps a waking loop thread from preempting the running thread; it runs as soon
// as that thread blocks, which in these exchanges is at once. The threads started while
// Gloo created the device (`before` -> `after`) are moved; a thread that another part of
// the program started in that instant would be moved too, which only costs it wake-up
// preemption. TROUPE_GLOO_LOOP_BATCH=0 leaves the policy alone.
void batch_loop_threads(const std::vector<pid_t>& before, const std::vector<pid_t>& after) {
  if (auto v = settings::gloo_loop_batch.value(); v && *v == "0") return;
  std::vector<pid_t> started;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(started));
  for (pid_t tid : started) {
    sched_param p{};
    if (::sched_setscheduler(tid, SCHED_BATCH, &p) != 0)
      TROUPE_LOG(log_level::debug, "collectives", "could not move gloo's event-loop thread ", tid,
                 " to SCHED_BATCH");
  }
}

// Same-host connections of the group get a small send buffer (collectives/gloo/
// local_sockets.hpp says why). Each pair's address is its connection's local address.
void size_local_send_buffers(gloo::Context& ctx) {
  const std::size_t bytes = gloo_sockets::local_sndbuf_from_env();
  if (bytes == 0) return;
  std::vector<sockaddr_storage> locals;
  for (int r = 0; r < ctx.size; ++r)
    if (r != ctx.rank && ctx.getPair(r))
      locals.push_back(static_cast<const gloo::transport::tcp::Address&>(ctx.getPair(r)->address())
                           .getSockaddr());
  gloo_sockets::size_local_send_buffers(gloo_sockets::connections_from(locals), bytes);
}

}  // namespace troupe::collectives::gloo_os
