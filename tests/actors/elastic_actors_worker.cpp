// A program written as a user would, for an elastic world with the RPC agent and actors:
//   troupe-run --standalone --nproc-per-node 3 --max-restarts 1 --failure-policy replace
//       elastic_actors_worker
// Every worker calls troupe::init({.rpc = true}) (elastic, because troupe-run sets
// TROUPE_ELASTIC=1), makes an actor node over its agent and publishes "echo". Once the world
// holds all three, each monitors the other two's echo actors and they meet; then worker1 of
// the first start kills itself with SIGKILL. The survivors record what each part saw:
// - the group: the epoch its allreduce was stopped for, which left worker1 out (or the first
//   epoch it rebuilds in without worker1, should it get there before the work fails);
// - RPC: the `failed` event for worker1 and the epoch its reason names;
// - actors: the down message of worker1's echo proxy and the epoch its reason names;
// and check that the three are one epoch. Then the replacement comes: the survivors see the
// group whole again, the RPC agent's `joined` for worker1, and get an answer from the new
// "worker1/echo". Prints "<me>: group, rpc and monitors saw worker1 leave in epoch E" on the
// survivors and "<me>: ok in epoch E" on everyone at the end. Exit codes: 0 ok, 2 setup
// failed, 3 a check failed.
#include <signal.h>

#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/node.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/world/world.hpp>
#include "test_types.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;
using namespace std::chrono_literals;

namespace {

int check_failed(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "%s: check failed: %s\n", who.c_str(), what.c_str());
  return 3;
}

// The epoch a membership_changed error moves to ("... to epoch N ..."), or nullopt.
std::optional<std::uint64_t> epoch_named(const error& e) {
  if (e.code() != errc::membership_changed) return std::nullopt;
  const std::string& m = e.message();
  auto at = m.find(" to epoch ");
  if (at == std::string::npos) return std::nullopt;
  return std::stoull(m.substr(at + 10));
}

// What the RPC agent and the monitors saw of worker1, filled from their threads.
struct sightings {
  std::mutex mu;
  int rpc_failed = 0;
  std::optional<error> rpc_reason;
  int rpc_joined_after_failure = 0;
  std::optional<error> down_reason;
};

}  // namespace

int main() {
  caf::actor_system_config cfg;
  configure(cfg);
  auto types = std::make_shared<message_types>();
  register_types(cfg, *types, false);
  caf::actor_system sys{cfg};
  sightings seen;  // outlives the world, whose threads write it

  init_options o;
  o.timeout = 30s;
  o.backend = "gloo";
  o.rpc = true;
  o.rpc_options.rpc_timeout = 20s;
  o.rpc_options.device_count = 0;
  auto w = init(o);
  if (!w) {
    std::fprintf(stderr, "init failed: %s\n", w.error().to_string().c_str());
    return 2;
  }
  const std::string me = "worker" + std::to_string(w->env().rank);
  const bool first_start = w->env().restart_count == 0;
  auto* eg = w->elastic();
  if (eg == nullptr || !w->rpc())
    return check_failed(me, "init did not make an elastic world with RPC");
  w->rpc()->add_membership_listener([&seen](const rpc::membership_event& e) {
    if (e.worker.name != "worker1") return;
    std::lock_guard lk(seen.mu);
    if (e.change == rpc::membership_change::failed) {
      ++seen.rpc_failed;
      seen.rpc_reason = e.reason;
    } else if (e.change == rpc::membership_change::joined && seen.rpc_failed > 0) {
      ++seen.rpc_joined_after_failure;
    }
  });
  auto n = node::make(sys, *w, types);
  if (!n) return check_failed(me, "node: " + n.error().to_string());
  if (!(*n)->publish(sys.spawn(echo_actor), "echo")) return check_failed(me, "publish failed");

  // The world of three, all published.
  auto v = eg->rebuild(30s);
  for (int i = 0; v && v->epoch.size() < 3 && i < 100; ++i) {
    (void)eg->wait_for_change(v->epoch.number, 500ms);
    v = eg->rebuild(30s);
  }
  if (!v || v->epoch.size() != 3) return check_failed(me, "the world never held three");
  auto meet = [&](const std::string& what,
                  const std::vector<std::string>& names) -> expected<void> {
    TROUPE_TRY(w->store()->set("test/" + what + "/" + me, std::string_view("1")));
    std::vector<std::string> keys;
    for (const auto& name : names) keys.push_back("test/" + what + "/" + name);
    return w->store()->wait(keys, 60s);
  };

  if (first_start) {
    if (auto m = meet("published", {"worker0", "worker1", "worker2"}); !m)
      return check_failed(me, "meeting: " + m.error().to_string());
    // Monitor worker1's echo actor from a scoped actor (the proxy is kept: a proxy nobody
    // holds is gone at once).
    std::optional<caf::actor> worker1_echo;
    caf::scoped_actor watcher{sys};
    if (me != "worker1") {
      auto echo = (*n)->remote_actor("worker1/echo");
      if (!echo) return check_failed(me, "remote_actor: " + echo.error().to_string());
      worker1_echo = *echo;
      watcher->monitor(*worker1_echo);
    }
    if (auto m = meet("armed", {"worker0", "worker1", "worker2"}); !m)
      return check_failed(me, "meeting: " + m.error().to_string());
    if (me == "worker1") ::raise(SIGKILL);

    // The survivors: allreduce on the group until it moves to an epoch without worker1.
    std::optional<std::uint64_t> group_epoch;
    std::string group_failure;
    for (int round = 0; round < 200 && !group_epoch; ++round) {
      v = eg->rebuild(30s);
      if (!v) return check_failed(me, "rebuild: " + v.error().to_string());
      if (!v->epoch.find("worker1")) {
        group_epoch = v->epoch.number;
        break;
      }
      std::vector<float> t(16, 1.0f);
      auto r = v->group->allreduce({t.data(), dtype::float32, t.size()}).wait(60s);
      if (!r) {
        group_failure = r.error().to_string();
        // The group's work stopped naming the epoch that left worker1 out. That is the
        // group's sighting: the replacement may join before the next rebuild, which then
        // lands in the epoch after it, with a worker1 again.
        if (auto e = epoch_named(r.error());
            e && r.error().message().find("left: worker1 ") != std::string::npos) {
          group_epoch = *e;
          break;
        }
        (void)eg->wait_for_change(v->epoch.number, 2s);
      }
    }
    if (!group_epoch) return check_failed(me, "the group never left worker1 out");
    // The monitor's down message (it may have come already: it waits in the mailbox).
    watcher->receive(
        [&](caf::down_msg& d) {
          if (d.source != worker1_echo->address()) return;
          std::lock_guard lk(seen.mu);
          seen.down_reason = from_caf_error(d.reason);
        },
        caf::after(std::chrono::seconds(10)) >> [] {});
    // The agent hears of it on its own threads: give it a moment.
    std::optional<std::uint64_t> rpc_epoch, down_epoch;
    for (int i = 0; i < 100; ++i) {
      {
        std::lock_guard lk(seen.mu);
        if (seen.rpc_reason) rpc_epoch = epoch_named(*seen.rpc_reason);
        if (seen.down_reason) down_epoch = epoch_named(*seen.down_reason);
        if (seen.rpc_reason) break;
      }
      std::this_thread::sleep_for(100ms);
    }
    {
      std::lock_guard lk(seen.mu);
      if (!seen.rpc_reason) return check_failed(me, "the RPC agent never said worker1 failed");
      if (!seen.down_reason) return check_failed(me, "no down message for worker1/echo");
      if (seen.rpc_failed != 1)
        return check_failed(
            me, "the RPC agent said worker1 failed " + std::to_string(seen.rpc_failed) + " times");
      if (rpc_epoch != group_epoch)
        return check_failed(me, "the RPC agent's reason names another epoch than the group's (" +
                                    std::to_string(*group_epoch) +
                                    "): " + seen.rpc_reason->to_string());
      if (down_epoch != group_epoch)
        return check_failed(me, "the down message names another epoch than the group's (" +
                                    std::to_string(*group_epoch) +
                                    "): " + seen.down_reason->to_string());
    }
    std::printf(
        "%s: group, rpc and monitors saw worker1 leave in epoch %llu (the group's work failed "
        "with: %s)\n",
        me.c_str(), static_cast<unsigned long long>(*group_epoch),
        group_failure.empty() ? "nothing pending" : group_failure.c_str());
    std::fflush(stdout);

    // The replacement: the group whole again, RPC's join, and its echo answering.
    for (int round = 0; round < 200; ++round) {
      v = eg->rebuild(30s);
      if (!v) return check_failed(me, "rebuild: " + v.error().to_string());
      if (v->epoch.size() == 3) break;
      (void)eg->wait_for_change(v->epoch.number, 500ms);
    }
    if (!v || v->epoch.size() != 3)
      return check_failed(me, "the replacement never joined the group");
  }
  if (auto m = meet("replaced", {"worker0", "worker1", "worker2"}); !m)
    return check_failed(me, "meeting: " + m.error().to_string());
  if (first_start) {
    {
      std::lock_guard lk(seen.mu);
      if (seen.rpc_joined_after_failure != 1)
        return check_failed(me, "the RPC agent said the replacement joined " +
                                    std::to_string(seen.rpc_joined_after_failure) + " times");
    }
    auto echo = (*n)->remote_actor("worker1/echo");
    if (!echo)
      return check_failed(me, "remote_actor of the replacement: " + echo.error().to_string());
    caf::scoped_actor self{sys};
    std::int32_t answer = 0;
    std::string failure;
    self->request(*echo, std::chrono::seconds(20), ping_atom::value, std::int32_t{41})
        .receive([&](std::int32_t x) { answer = x; },
                 [&](caf::error& e) { failure = from_caf_error(e).to_string(); });
    if (answer != 42)
      return check_failed(
          me, "the replacement's echo answered " + std::to_string(answer) + " " + failure);
  }
  // Everyone got here in this epoch; meet before anyone leaves (a leave is an epoch).
  if (auto m = meet("done", {"worker0", "worker1", "worker2"}); !m)
    return check_failed(me, "meeting: " + m.error().to_string());
  std::printf("%s: ok in epoch %llu\n", me.c_str(),
              static_cast<unsigned long long>(v->epoch.number));
  std::fflush(stdout);
  (*n)->shutdown();
  if (auto s = w->shutdown(); !s) return check_failed(me, "shutdown: " + s.error().to_string());
  return 0;
}
