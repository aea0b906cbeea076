// Real rank processes on 127.0.0.1 running the gloo backend: the parent hosts a TCP store
// on port 0 and starts one collectives_test_worker per rank.
#include <doctest/doctest.h>

#include <troupe/collectives/group.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "spawn.hpp"
#include "support/skip.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

struct ranks {
  std::unique_ptr<troupe::tcp_store_server> server = troupe::tcp_store_server::start({}).value();
  std::vector<pid_t> pids;

  void start(const std::string& mode, int world) {
    for (int r = 0; r < world; ++r) {
      pids.push_back(start_process({TROUPE_COLLECTIVES_TEST_WORKER, mode, server->url(),
                                    std::to_string(r), std::to_string(world)}));
      REQUIRE(pids.back() > 0);
    }
  }
  void expect_success(std::chrono::milliseconds timeout, std::vector<pid_t> only = {}) {
    auto st = wait_children(only.empty() ? pids : only, timeout);
    for (auto& [pid, s] : st) {
      CAPTURE(pid);
      int signal = s != -1 && WIFSIGNALED(s) ? WTERMSIG(s) : 0;
      CAPTURE(signal);
      CHECK(exited_zero(s));
    }
  }
};

}  // namespace

TEST_CASE("every collective on every dtype matches local results at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    ranks rs;
    rs.start("ops", world);
    rs.expect_success(25s);
  }
}

TEST_CASE(
    "subgroups by rank list and by color and the parallelism layout reduce among their members") {
  for (int world : {3, 4}) {
    CAPTURE(world);
    ranks rs;
    rs.start("groups", world);
    rs.expect_success(25s);
  }
}

TEST_CASE("an allreduce that one rank skips fails within its timeout naming that rank") {
  ranks rs;
  rs.start("timeout", 2);
  rs.expect_success(20s);
}

TEST_CASE("killing a rank in a large allreduce fails the survivors in time and they regroup") {
  constexpr int world = 3;
  ranks rs;
  rs.start("kill", world);
  troupe::store_options so;
  so.timeout = 20s;
  auto s = troupe::connect_store(rs.server->url(), so).value();
  // Wait until every rank is inside its allreduce loop, then kill the last one.
  REQUIRE(every_rank_counted(*s, "looping", world));
  REQUIRE(::kill(rs.pids.back(), SIGKILL) == 0);
  auto victim = wait_children({rs.pids.back()}, 5s);
  CHECK(WIFSIGNALED(victim[rs.pids.back()]));
  rs.expect_success(25s, {rs.pids.begin(), rs.pids.end() - 1});
}

TEST_CASE("a gloo member on another host that would bind loopback fails the group naming it") {
  pid_t probe = start_process({"/usr/bin/unshare", "--uts", "/bin/true"});
  if (probe <= 0 || !exited_zero(wait_children({probe}, 10s)[probe]))
    TROUPE_SKIP_TEST("unshare --uts is not permitted here (needs root)");
  ranks r;
  // Rank 1 runs under another host name (a UTS namespace) in this network namespace: both
  // ranks would bind 127.0.0.1, which a real second host could never reach.
  r.pids.push_back(
      start_process({"/usr/bin/unshare", "--uts", "/bin/sh", "-c",
                     "hostname troupe-other-host && exec \"$0\" \"$@\"",
                     TROUPE_COLLECTIVES_TEST_WORKER, "ops", r.server->url(), "1", "2"}));
  REQUIRE(r.pids.back() > 0);
  troupe::collectives::world_options o;
  o.rank = 0;
  o.size = 2;
  o.store = troupe::connect_store(r.server->url()).value();
  o.backend = "gloo";
  o.timeout = 20s;
  auto g = troupe::collectives::init_world(o);
  auto st = wait_children(r.pids, 30s);
  REQUIRE_FALSE(g);
  INFO(g.error().to_string());
  CHECK(g.error().code() == troupe::errc::invalid_argument);
  CHECK(g.error().message().find("spans 2 hosts") != std::string::npos);
  CHECK(g.error().message().find("rank 0 on host") != std::string::npos);
  CHECK(g.error().message().find("advertises 127.0.0.1") != std::string::npos);
  CHECK(g.error().message().find("TROUPE_SOCKET_IFNAME") != std::string::npos);
  CHECK_FALSE(exited_zero(st[r.pids.back()]));  // rank 1 failed the same way
}
