// Real processes meeting through etcd: sixteen workers rendezvous (all_gather of names and
// a barrier) and a membership token passes on when its holder is killed. The workers are
// store_test_worker processes given an etcd:// store URL.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <troupe/store/connect.hpp>
#include "support/child_process.hpp"
#include "support/etcd_server.hpp"
#include "support/skip.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using troupe::test::etcd_server;

pid_t spawn_worker(const std::vector<std::string>& args) {
  std::string why;
  pid_t pid = troupe::test::spawn_process(args, {}, &why);
  REQUIRE_MESSAGE(pid > 0, why);
  return pid;
}

// Waits for `pid` at most `timeout`; kills it when it overstays. Returns the wait
// status, or -1 when it had to be killed.
int wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  return troupe::test::wait_processes({pid}, timeout).at(pid);
}

using troupe::test::exited_zero;

std::unique_ptr<troupe::store> open(const std::string& url) {
  troupe::store_options o;
  o.timeout = 20s;
  auto s = troupe::connect_store(url, o);
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.error().to_string()));
  return std::move(*s);
}

}  // namespace

TEST_CASE("sixteen processes rendezvous through etcd and all see every name") {
  auto* etcd = etcd_server::shared();
  if (!etcd) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  // Unleased keys: a rank that finishes first must not take the barrier's keys with it.
  const std::string url = "etcd://" + etcd->endpoint() +
                          troupe::test::unique_etcd_prefix("gather") + "?attach_lease=false";
  constexpr int world = 16;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r)
    pids.push_back(spawn_worker(
        {TROUPE_STORE_TEST_WORKER, "gather", url, std::to_string(r), std::to_string(world)}));
  std::map<pid_t, int> status;
  for (pid_t p : pids) status[p] = wait_for(p, 90s);
  for (pid_t p : pids) {
    CAPTURE(p);
    CHECK(exited_zero(status[p]));
  }
  auto s = open(url);
  CHECK(s->add("saw-all", 0).value() == world);
}

TEST_CASE("a token held by a process killed with SIGKILL passes on through etcd") {
  auto* etcd = etcd_server::shared();
  if (!etcd) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  // Leased keys with a short TTL: the killed holder's keys expire on their own.
  const std::string url = "etcd://" + etcd->endpoint() + troupe::test::unique_etcd_prefix("token") +
                          "?lease_ttl=2s&attach_lease=true";
  auto s = open(url);
  pid_t holder = spawn_worker({TROUPE_STORE_TEST_WORKER, "hold-token", url});
  auto holding = s->get("doomed/holding", 20s);
  if (!holding) wait_for(holder, 1ms);
  REQUIRE(holding.has_value());
  pid_t taker = spawn_worker({TROUPE_STORE_TEST_WORKER, "take-token", url});
  auto waiting = s->get("taker/waiting", 20s);
  if (!waiting) wait_for(taker, 1ms);
  REQUIRE(waiting.has_value());
  REQUIRE(::kill(holder, SIGKILL) == 0);
  CHECK(WIFSIGNALED(wait_for(holder, 10s)));
  CHECK(exited_zero(wait_for(taker, 30s)));
  // The killed holder's keys expire with its lease (polled here, in the test only).
  std::vector<std::string> holder_key{"doomed/holding"};
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (s->check(holder_key, 5s).value() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(100ms);
  CHECK_FALSE(s->check(holder_key, 5s).value());
}
