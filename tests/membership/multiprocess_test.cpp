// Real member processes meeting through a real TCP store on 127.0.0.1: ranks killed with
// SIGKILL, two at once, one joining during a death, one stopped with SIGSTOP, and the last
// survivor alone (docs/membership.md).
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include <troupe/membership/epoch.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace m = troupe::membership;

constexpr auto timeout_ms = 1000;
constexpr auto interval_ms = 100;

// A member process, killed and reaped on every exit path (even while stopped: SIGKILL ends
// a stopped process too).
struct child {
  std::string name;
  troupe::test::child_process proc;
  pid_t pid = -1;  // proc's, for the signals a test sends
  fs::path log;

  // Waits up to `timeout` for it to exit by itself; kills it after that. True if it exited.
  bool wait(std::chrono::milliseconds timeout) { return proc.wait(timeout); }
  int exit_code() const { return proc.exit_code(); }
  std::string log_text() const { return proc.output_text(); }
};

struct job {
  std::unique_ptr<troupe::tcp_store_server> server;
  std::shared_ptr<troupe::store> client;
  std::unique_ptr<troupe::prefix_store> records;
  std::string scope = "test-job";
  fs::path dir;
  std::map<std::string, std::unique_ptr<child>> members;

  job() {
    auto started = troupe::tcp_store_server::start({});
    REQUIRE(started.has_value());
    server = std::move(*started);
    troupe::store_options o;
    o.connect_timeout = 5s;
    o.timeout = 10s;
    auto c = troupe::connect_store(server->url(), o);
    REQUIRE(c.has_value());
    client = std::move(*c);
    records = std::make_unique<troupe::prefix_store>(client, scope);
    dir = fs::temp_directory_path() / ("troupe-membership-" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~job() {
    members.clear();  // kills what is left before the store goes
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // Starts member `name`; `env` adds variables to its environment.
  child& start(const std::string& name, int t_ms = timeout_ms, int i_ms = interval_ms,
               const std::vector<std::string>& env = {}) {
    auto c = std::make_unique<child>();
    c->name = name;
    c->log = dir / (name + ".log");
    std::vector<std::string> args{TROUPE_MEMBERSHIP_TEST_WORKER, server->url(),       scope, name,
                                  std::to_string(t_ms),          std::to_string(i_ms)};
    c->proc = troupe::test::child_process::start(args, {.env = env, .output = c->log.string()});
    REQUIRE_MESSAGE(c->proc.started(), "cannot start ", args[0], ": ", c->proc.start_error());
    c->pid = c->proc.pid();
    auto& ref = *c;
    members[name] = std::move(c);
    return ref;
  }

  // The latest epoch `name` recorded, if any.
  std::optional<m::epoch> latest(const std::string& name) {
    const std::string keys[] = {"latest/" + name};
    auto present = records->check(keys, 5s);
    if (!present || !*present) return std::nullopt;
    auto text = records->get_string("latest/" + name, 5s);
    if (!text) return std::nullopt;
    auto e = m::decode(*text);
    if (!e) return std::nullopt;
    return *e;
  }

  // Waits until every member in `names` has recorded an epoch for which `pred` holds and
  // they all recorded the same one; returns it. Fails the test with what each saw otherwise.
  m::epoch agreed(const std::vector<std::string>& names,
                  const std::function<bool(const m::epoch&)>& pred,
                  std::chrono::milliseconds timeout = 20s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string report;
    for (;;) {
      report.clear();
      std::optional<m::epoch> first;
      bool ok = true;
      for (const auto& n : names) {
        auto e = latest(n);
        report += n + ": " + (e ? m::encode(*e) : std::string("nothing\n"));
        if (!e || !pred(*e)) {
          ok = false;
        } else if (!first) {
          first = e;
        } else if (!(*first == *e)) {
          ok = false;
        }
      }
      if (ok) return *first;
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(20ms);
    }
    FAIL("the members did not agree on a wanted epoch in time; they saw:\n", report);
    return {};
  }

  // Every member in `names` saw every epoch from `from` to `to`, each equal to the history.
  void check_history(const std::vector<std::string>& names, std::uint64_t from, std::uint64_t to) {
    troupe::prefix_store history(*client, scope + "/membership");
    for (std::uint64_t k = from; k <= to; ++k) {
      auto h = history.get_string("epoch/" + std::to_string(k), 5s);
      REQUIRE_MESSAGE(h.has_value(), "the history lacks epoch ", k);
      for (const auto& n : names) {
        auto seen = records->get_string("seen/" + n + "/" + std::to_string(k), 5s);
        CAPTURE(n);
        CAPTURE(k);
        REQUIRE(seen.has_value());
        CHECK(*seen == *h);
      }
    }
  }

  // Sets `stop` and checks every listed member leaves and exits 0.
  void stop_all(const std::vector<std::string>& names) {
    REQUIRE(records->set("stop", std::string_view("1")));
    for (const auto& n : names) {
      auto& c = *members.at(n);
      CAPTURE(n);
      CHECK(c.wait(30s));
      CHECK_MESSAGE(c.exit_code() == 0, c.log_text());
    }
  }

  void kill(const std::string& name) {
    auto& c = *members.at(name);
    REQUIRE(::kill(c.pid, SIGKILL) == 0);
    c.wait(10s);
  }
};

bool has_all(const m::epoch& e, const std::vector<std::string>& names) {
  if (e.size() != names.size()) return false;
  for (const auto& n : names)
    if (!e.contains(n)) return false;
  return true;
}

std::vector<std::string> names_of(int n, int from = 0) {
  std::vector<std::string> out;
  for (int i = from; i < n; ++i) out.push_back("worker" + std::to_string(i));
  return out;
}

std::vector<std::string> without(std::vector<std::string> v, const std::vector<std::string>& gone) {
  std::erase_if(v, [&](const std::string& s) {
    return std::find(gone.begin(), gone.end(), s) != gone.end();
  });
  return v;
}

}  // namespace

TEST_CASE(
    "a rank killed with SIGKILL is left out of the next epoch that every survivor agrees on") {
  job j;
  auto all = names_of(4);
  for (const auto& n : all) j.start(n);
  auto full = j.agreed(all, [&](const m::epoch& e) { return has_all(e, all); });
  const auto victim = *full.find("worker2");
  j.kill("worker2");
  auto survivors = without(all, {"worker2"});
  auto after = j.agreed(survivors, [&](const m::epoch& e) { return has_all(e, survivors); });
  CHECK(after.number == full.number + 1);
  CAPTURE(after.cause);
  CHECK(after.cause.find(m::describe(victim) + ": heartbeat silent") != std::string::npos);
  // Dense ranks, survivors in their old order.
  std::vector<std::string> old_order;
  for (const auto& mb : full.members)
    if (mb.name != "worker2") old_order.push_back(mb.name);
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after.members[i].rank == static_cast<int>(i));
    CHECK(after.members[i].name == old_order[i]);
  }
  j.check_history(survivors, full.number, after.number);
  j.stop_all(survivors);
}

TEST_CASE("two ranks killed at once leave the survivors agreeing on one epoch without both") {
  job j;
  auto all = names_of(5);
  for (const auto& n : all) j.start(n);
  auto full = j.agreed(all, [&](const m::epoch& e) { return has_all(e, all); });
  REQUIRE(::kill(j.members.at("worker1")->pid, SIGKILL) == 0);
  REQUIRE(::kill(j.members.at("worker3")->pid, SIGKILL) == 0);
  j.members.at("worker1")->wait(10s);
  j.members.at("worker3")->wait(10s);
  auto survivors = without(all, {"worker1", "worker3"});
  auto after = j.agreed(survivors, [&](const m::epoch& e) { return has_all(e, survivors); });
  // One epoch when one watcher saw both silent, two when two watchers raced; never more.
  CHECK(after.number >= full.number + 1);
  CHECK(after.number <= full.number + 2);
  CHECK(after.cause.find("heartbeat silent") != std::string::npos);
  j.check_history(survivors, full.number, after.number);
  j.stop_all(survivors);
}

TEST_CASE(
    "a rank that joins while a death is being agreed is in the epoch every member agrees on") {
  job j;
  auto all = names_of(3);
  for (const auto& n : all) j.start(n);
  auto full = j.agreed(all, [&](const m::epoch& e) { return has_all(e, all); });
  REQUIRE(::kill(j.members.at("worker1")->pid, SIGKILL) == 0);
  // The newcomer starts while the survivors' clocks for worker1 are running out.
  std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms - 2 * interval_ms));
  j.start("worker9");
  j.members.at("worker1")->wait(10s);
  std::vector<std::string> final_members{"worker0", "worker2", "worker9"};
  auto after =
      j.agreed(final_members, [&](const m::epoch& e) { return has_all(e, final_members); });
  CHECK(after.find("worker9")->rank == 2);
  CHECK(after.number == full.number + 2);
  j.check_history({"worker0", "worker2"}, full.number, after.number);
  j.stop_all(final_members);
}

TEST_CASE(
    "a rank stopped with SIGSTOP is declared dead within the heartbeat timeout and the survivors' "
    "log names it") {
  job j;
  auto all = names_of(3);
  // The heartbeat settings come from the environment here, as a job would set them.
  const std::vector<std::string> env{"TROUPE_HEARTBEAT_TIMEOUT=1500ms",
                                     "TROUPE_HEARTBEAT_INTERVAL=100ms"};
  for (const auto& n : all) j.start(n, 0, 0, env);
  auto full = j.agreed(all, [&](const m::epoch& e) { return has_all(e, all); });
  const auto victim = *full.find("worker1");
  auto& stopped = *j.members.at("worker1");
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(stopped.pid, SIGSTOP) == 0);
  auto survivors = without(all, {"worker1"});
  auto after = j.agreed(survivors, [&](const m::epoch& e) { return has_all(e, survivors); });
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  MESSAGE("stopped to agreed: ", took.count(), " ms (timeout 1500 ms, interval 100 ms)");
  // Not before its last beat plus the timeout; within the timeout plus a few intervals and
  // this loaded machine's scheduling slack.
  CHECK(took >= 1300ms);
  CHECK(took < 4500ms);
  CAPTURE(after.cause);
  CHECK(after.cause.find(m::describe(victim) + ": heartbeat silent") != std::string::npos);
  // The survivor that declared it logged its name, rank, host and pid.
  std::string logs;
  for (const auto& n : survivors) logs += j.members.at(n)->log_text();
  CAPTURE(logs);
  CHECK(logs.find("declares " + m::describe(victim) + " dead") != std::string::npos);
  // Continued, it finds itself out of the job and stops with membership_changed.
  REQUIRE(::kill(stopped.pid, SIGCONT) == 0);
  auto evicted = j.records->get_string("evicted/worker1", 15s);
  REQUIRE(evicted.has_value());
  CHECK(evicted->rfind("membership_changed", 0) == 0);
  CHECK(evicted->find("is not in epoch " + std::to_string(after.number)) != std::string::npos);
  CHECK(stopped.wait(15s));
  CHECK(stopped.exit_code() == 3);
  j.stop_all(survivors);
}

TEST_CASE("the last survivor of a job of three is alone in an epoch of one, at rank 0") {
  job j;
  auto all = names_of(3);
  for (const auto& n : all) j.start(n);
  j.agreed(all, [&](const m::epoch& e) { return has_all(e, all); });
  j.kill("worker0");
  j.agreed({"worker1", "worker2"}, [](const m::epoch& e) { return e.size() == 2; });
  j.kill("worker1");
  auto alone = j.agreed({"worker2"}, [](const m::epoch& e) { return e.size() == 1; });
  CHECK(alone.names() == "worker2");
  CHECK(alone.members[0].rank == 0);
  j.stop_all({"worker2"});
}
