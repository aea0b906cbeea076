// node_rendezvous against a real troupe-store that stops answering (SIGSTOP), as a store
// cut off from a node looks to it: the watch's store calls are bounded by the heartbeat
// timeout, not by the much longer timeout of each store call.
#include <signal.h>

#include <troupe/launcher/node_rendezvous.hpp>
#include <troupe/store/connect.hpp>
#include "process_helpers.hpp"

using namespace launcher_test;

namespace {

using clk = std::chrono::steady_clock;

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

}  // namespace

TEST_CASE(
    "a store that stops answering fails the rendezvous' watch within the heartbeat timeout, "
    "and the watch answers again once the store does") {
  auto dir = fresh_dir("store-loss");
  auto server = start({TROUPE_STORE_BINARY, "--port", "0"}, dir / "store.log");
  std::string addr;
  REQUIRE(eventually([&] {
    auto text = server->text();
    auto at = text.find("listening on ");
    if (at == std::string::npos) return false;
    auto nl = text.find('\n', at);
    if (nl == std::string::npos) return false;
    addr = text.substr(at + 13, nl - at - 13);
    return true;
  }));
  troupe::store_options so;
  so.timeout = 30s;
  so.connect_timeout = 5s;
  auto s = troupe::connect_store("tcp://" + addr, so);
  REQUIRE_MESSAGE(s, s.error().to_string());

  troupe::launcher::rendezvous_settings rs;
  rs.min_nodes = rs.max_nodes = 1;
  rs.last_call = troupe::duration::zero();
  rs.join_timeout = 10s;
  rs.op_timeout = 30s;
  rs.heartbeat_timeout = 2s;
  troupe::launcher::node_rendezvous r(**s, rs);
  troupe::launcher::node_info me;
  me.nproc = 1;
  me.addr = "127.0.0.1";
  me.id = "node-a";
  auto round = r.next_round(me);
  REQUIRE_MESSAGE(round, round.error().to_string());
  auto calm = r.should_reform();
  REQUIRE_MESSAGE(calm, calm.error().to_string());
  CHECK(!*calm);

  server->proc.signal(SIGSTOP);
  // Bounded by the heartbeat timeout (2 s), not by the store call's 30 s: the pass makes
  // several calls, the first due heartbeat among them, and all share the bound.
  std::this_thread::sleep_for(600ms);  // a heartbeat is due (every 500 ms)
  auto t0 = clk::now();
  auto lost = r.should_reform();
  const double first = seconds_since(t0);
  CHECK(!lost);
  if (!lost) CHECK(lost.error().code() == troupe::errc::timeout);
  CHECK(first >= 1.5);
  CHECK(first < 10.0);
  // The next passes wait a quarter of that (the heartbeat's period) while it stays away.
  t0 = clk::now();
  auto still = r.should_reform();
  const double second = seconds_since(t0);
  CHECK(!still);
  CHECK(second < 0.5 + 5.0);
  CHECK(second < first);

  server->proc.signal(SIGCONT);
  CHECK(eventually(
      [&] {
        auto again = r.should_reform();
        return again && !*again;
      },
      20s));
  server->proc.signal(SIGKILL);
  server->wait(5s);
  fs::remove_all(dir);
}
