// A worker process for the multi-process actor tests.
//   actors_test_worker <store_url> <name>
// Joins the dynamic RPC group as <name>, publishes echo, counter, mortal and calc, then
// writes "ready/<name>". Once "driver_ready" exists it requests (ping, 41) from
// "driver/driver_echo" and writes the answer to "result/<name>". It leaves the group when
// "leave/<name>" appears. Exit codes: 0 ok, 2 setup failed, 3 a check failed.
#include <iostream>

#include <troupe/actors/node.hpp>
#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include "test_types.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: actors_test_worker <store_url> <name>\n";
    return 64;
  }
  std::string url = argv[1], name = argv[2];
  auto store = connect_store(url);
  if (!store) return 2;

  caf::actor_system_config cfg;
  configure(cfg);
  auto types = std::make_shared<message_types>();
  register_types(cfg, *types, false);
  caf::actor_system sys{cfg};

  rpc::rpc_backend_options o;
  o.init_method = url;
  o.rpc_timeout = 20s;
  o.init_timeout = 20s;
  o.shutdown_timeout = 10s;
  o.device_count = 0;
  auto agent = rpc::init_rpc(name, 0, std::nullopt, o);
  if (!agent) {
    std::cerr << name << ": " << agent.error() << "\n";
    return 2;
  }
  std::shared_ptr<rpc::agent> a(std::move(*agent));
  auto n = node::attach(sys, a, types);
  if (!n) {
    std::cerr << name << ": " << n.error() << "\n";
    return 2;
  }
  auto& nd = **n;
  bool published = nd.publish(sys.spawn(echo_actor), "echo") &&
                   nd.publish(sys.spawn(counter_actor), "counter") &&
                   nd.publish(sys.spawn(mortal_actor), "mortal") &&
                   nd.publish(caf::actor_cast<caf::actor>(sys.spawn(calculator_actor)), "calc");
  if (!published || !(*store)->set("ready/" + name, std::string_view("1"))) return 2;

  int rc = 0;
  std::array<std::string, 1> ready{"driver_ready"};
  if ((*store)->wait(ready, 30s)) {
    auto driver = nd.remote_actor("driver/driver_echo");
    if (!driver) {
      std::cerr << name << ": " << driver.error() << "\n";
      rc = 3;
    } else {
      caf::scoped_actor self{sys};
      std::string answer = "none";
      self->request(*driver, 10s, ping_atom::value, std::int32_t{41})
          .receive([&](std::int32_t v) { answer = std::to_string(v); },
                   [&](caf::error& e) { answer = "error: " + sys.render(e); });
      (void)(*store)->set("result/" + name, answer);
    }
  }
  std::array<std::string, 1> leave{"leave/" + name};
  (void)(*store)->wait(leave, 60s);
  nd.shutdown();
  if (auto r = a->leave(); !r) {
    std::cerr << name << ": leave: " << r.error() << "\n";
    rc = 3;
  }
  return rc;
}
