// Remote named actors between real worker processes on 127.0.0.1: the test process is the
// worker "driver" of a dynamic group; workers run actors_test_worker.
#include <doctest/doctest.h>

#include <signal.h>

#include <troupe/actors/node.hpp>
#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "collectives/spawn.hpp"
#include "test_types.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;
using namespace std::chrono_literals;
using troupe::collectives::testing::exited_zero;
using troupe::collectives::testing::start_process;
using troupe::collectives::testing::wait_children;

namespace {

const std::string worker_bin = TROUPE_ACTORS_TEST_WORKER;

// The driver's side of a test: a store, an actor system, an agent and a node.
struct driver {
  std::unique_ptr<tcp_store_server> server;
  std::unique_ptr<store> kv;
  std::shared_ptr<message_types> types = std::make_shared<message_types>();
  std::unique_ptr<caf::actor_system_config> cfg = std::make_unique<caf::actor_system_config>();
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<rpc::agent> agent;
  std::shared_ptr<node> n;

  driver() {
    auto s = tcp_store_server::start({});
    REQUIRE(s);
    server = std::move(*s);
    auto c = connect_store(server->url());
    REQUIRE(c);
    kv = std::move(*c);
    configure(*cfg);
    register_types(*cfg, *types, true);
    sys = std::make_unique<caf::actor_system>(*cfg);
    rpc::rpc_backend_options o;
    o.init_method = server->url();
    o.rpc_timeout = 20s;
    o.init_timeout = 20s;
    o.shutdown_timeout = 5s;
    o.device_count = 0;
    auto a = rpc::init_rpc("driver", 0, std::nullopt, o);
    REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
    agent = std::move(*a);
    auto nd = node::attach(*sys, agent, types);
    REQUIRE_MESSAGE(nd, (nd ? "" : nd.error().to_string()));
    n = *nd;
    REQUIRE(n->publish(sys->spawn(echo_actor), "driver_echo"));
    REQUIRE(kv->set("driver_ready", std::string_view("1")));
  }

  ~driver() {
    n->shutdown();
    (void)agent->leave();
  }

  // Starts a worker named `name` and waits until its actors are published.
  pid_t start_worker(const std::string& name) {
    pid_t p = start_process({worker_bin, server->url(), name});
    REQUIRE(p > 0);
    std::array<std::string, 1> ready{"ready/" + name};
    REQUIRE_MESSAGE(kv->wait(ready, 30s), "worker " << name << " did not publish its actors");
    return p;
  }
  void let_leave(const std::string& name) {
    REQUIRE(kv->set("leave/" + name, std::string_view("1")));
  }
};

template <class T>
expected<T> request(caf::actor_system& sys, const caf::actor& to, caf::message msg,
                    duration timeout = 10s) {
  caf::scoped_actor self{sys};
  expected<T> out = make_error(errc::timeout, "no reply");
  self->request(to, timeout, std::move(msg))
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { out = from_caf_error(e); });
  return out;
}

// Waits for the down message of `watched`; returns its reason, or nullopt on timeout.
std::optional<caf::error> wait_down(caf::scoped_actor& self, const caf::actor& watched,
                                    duration limit) {
  std::optional<caf::error> reason;
  self->receive(
      [&](caf::down_msg& d) {
        if (d.source == watched.address()) reason = d.reason;
      },
      caf::after(limit) >> [] {});
  return reason;
}

}  // namespace

TEST_CASE("requests and sends reach remote named actors in both directions") {
  driver d;
  pid_t w = d.start_worker("w1");
  auto echo = d.n->remote_actor("w1/echo");
  REQUIRE_MESSAGE(echo, (echo ? "" : echo.error().to_string()));
  CHECK(request<std::int32_t>(*d.sys, *echo, caf::make_message(ping_atom::value, std::int32_t{6}))
            .value() == 7);
  CHECK(request<std::string>(*d.sys, *echo, caf::make_message(std::string("hello"))).value() ==
        "hello");
  auto p = request<point>(*d.sys, *echo, caf::make_message(point{1, 2, "p"}));
  REQUIRE(p);
  CHECK(p->x == 2);
  CHECK(p->y == 1);
  CHECK(p->label == "p'");
  // The worker asked our driver_echo on its own: the other direction.
  auto answer = d.kv->get("result/w1", 20s);
  REQUIRE(answer);
  CHECK(to_string(*answer) == "42");
  d.let_leave("w1");
  auto st = wait_children({w}, 20s);
  CHECK(exited_zero(st[w]));
}

TEST_CASE("a typed actor interface works across processes") {
  driver d;
  pid_t w = d.start_worker("w1");
  auto calc = d.n->remote_typed_actor<calculator>("w1/calc");
  REQUIRE(calc);
  caf::scoped_actor self{*d.sys};
  std::int32_t sum = 0;
  self->request(*calc, 10s, add_atom::value, std::int32_t{20}, std::int32_t{22})
      .receive([&](std::int32_t v) { sum = v; }, [&](caf::error& e) { FAIL(d.sys->render(e)); });
  CHECK(sum == 42);
  d.let_leave("w1");
  CHECK(exited_zero(wait_children({w}, 20s)[w]));
}

TEST_CASE("messages from one sender arrive in the order they were sent") {
  driver d;
  pid_t w = d.start_worker("w1");
  auto counter = d.n->remote_actor("w1/counter");
  REQUIRE(counter);
  caf::scoped_actor self{*d.sys};
  const std::int32_t n = 2000;
  int wrong = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    self->send(*counter, i);
    // Plain sends leave in combined writes and run at the end of a read on the far side;
    // a request right behind them still sees every one of them.
    if (i % 250 == 249) {
      auto so_far =
          request<std::vector<std::int32_t>>(*d.sys, *counter, caf::make_message(get_atom::value));
      if (!so_far || so_far->size() != static_cast<std::size_t>(i + 1)) ++wrong;
    }
  }
  CHECK(wrong == 0);
  auto seen =
      request<std::vector<std::int32_t>>(*d.sys, *counter, caf::make_message(get_atom::value));
  REQUIRE_MESSAGE(seen, (seen ? "" : seen.error().to_string()));
  REQUIRE(seen->size() == static_cast<std::size_t>(n));
  bool in_order = true;
  for (std::int32_t i = 0; i < n; ++i)
    in_order = in_order && (*seen)[static_cast<std::size_t>(i)] == i;
  CHECK(in_order);
  d.let_leave("w1");
  CHECK(exited_zero(wait_children({w}, 20s)[w]));
}

TEST_CASE("unknown workers, unknown actors and unregistered types fail at once with their names") {
  driver d;
  pid_t w = d.start_worker("w1");
  auto start = clock::now();
  auto no_worker = d.n->remote_actor("w9/echo");
  REQUIRE_FALSE(no_worker);
  CHECK(no_worker.error().code() == errc::not_found);
  CHECK(no_worker.error().message().find("w9") != std::string::npos);
  auto no_actor = d.n->remote_actor("w1/nobody");
  REQUIRE_FALSE(no_actor);
  CHECK(no_actor.error().code() == errc::not_found);
  CHECK(no_actor.error().message().find("'nobody'") != std::string::npos);
  CHECK(no_actor.error().message().find("echo") != std::string::npos);  // lists what is there
  CHECK(d.n->remote_actor("no-slash").error().code() == errc::invalid_argument);
  CHECK(clock::now() - start < 5s);

  auto echo = d.n->remote_actor("w1/echo");
  REQUIRE(echo);
  auto unregistered = request<std::int32_t>(*d.sys, *echo, caf::make_message(never_registered{1}));
  REQUIRE_FALSE(unregistered);
  CHECK(unregistered.error().code() == errc::unsupported);
  CHECK(unregistered.error().message().find("never_registered") != std::string::npos);
  auto remote_unknown = request<std::int32_t>(*d.sys, *echo, caf::make_message(driver_only{1}));
  REQUIRE_FALSE(remote_unknown);
  CHECK(remote_unknown.error().code() == errc::unsupported);
  CHECK(remote_unknown.error().message().find("driver_only") != std::string::npos);
  d.let_leave("w1");
  CHECK(exited_zero(wait_children({w}, 20s)[w]));
}

TEST_CASE("a monitor fires when the remote actor exits, and a later request fails") {
  driver d;
  pid_t w = d.start_worker("w1");
  auto mortal = d.n->remote_actor("w1/mortal");
  REQUIRE(mortal);
  caf::scoped_actor self{*d.sys};
  self->monitor(*mortal);
  self->send(*mortal, quit_atom::value);
  auto reason = wait_down(self, *mortal, 10s);
  CHECK(reason.has_value());
  auto late =
      request<std::int32_t>(*d.sys, *mortal, caf::make_message(ping_atom::value, std::int32_t{1}));
  CHECK_FALSE(late);
  d.let_leave("w1");
  CHECK(exited_zero(wait_children({w}, 20s)[w]));
}

TEST_CASE("a monitor fires when the remote actor's worker leaves the group") {
  driver d;
  pid_t w = d.start_worker("w2");
  auto echo = d.n->remote_actor("w2/echo");
  REQUIRE(echo);
  caf::scoped_actor self{*d.sys};
  self->monitor(*echo);
  d.let_leave("w2");
  auto reason = wait_down(self, *echo, 15s);
  REQUIRE(reason.has_value());
  CHECK(exited_zero(wait_children({w}, 20s)[w]));
}

TEST_CASE("a monitor fires promptly when the remote actor's worker is killed with SIGKILL") {
  driver d;
  pid_t w = d.start_worker("w3");
  auto echo = d.n->remote_actor("w3/echo");
  REQUIRE(echo);
  caf::scoped_actor self{*d.sys};
  self->monitor(*echo);
  ::kill(w, SIGKILL);
  auto t0 = clock::now();
  auto reason = wait_down(self, *echo, 10s);
  REQUIRE(reason.has_value());
  CHECK(clock::now() - t0 < 5s);
  auto err = from_caf_error(*reason);
  CHECK((err.code() == errc::connection_lost || err.code() == errc::peer_left));
  CHECK(err.message().find("w3") != std::string::npos);
  wait_children({w}, 5s);
}
