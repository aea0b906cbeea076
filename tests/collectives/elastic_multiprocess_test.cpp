// Elastic groups across real processes meeting through a real TCP store on 127.0.0.1:
// ranks killed with SIGKILL (one, two at once, all but one), one stopped with SIGSTOP, one
// joining a running job. Each worker (elastic_test_worker.cpp) allreduces in a loop and
// checks every sum; the heartbeat timeout is 1 s and each allreduce's timeout 60 s, so a
// failure within a few seconds of a death was ended by the epoch change, not by a timeout.
// Ranks follow the order in which the workers joined, so the checks name workers, not ranks.
// The suite runs twice: with shared memory between the workers, and over TCP alone.
#include <doctest/doctest.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/store_job.hpp"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int heartbeat_ms = 1000;
constexpr int interval_ms = 100;
// What an epoch change may take beyond the heartbeat timeout on a loaded two-core machine:
// one watcher interval to notice, the agreement, the others' next read of the epoch.
constexpr std::int64_t slack_ms = 3000;

std::int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// What a worker last reported in ok/<name>.
struct progress {
  std::uint64_t epoch = 0;
  int size = 0;
  long ops = 0;
};

// A failed op as a worker reported it in failed/<name>/<k>.
struct failure {
  std::int64_t at_ns = 0;
  std::string code;
  std::string message;
};

struct job : troupe::test::store_job {
  job() : store_job("elastic-job", "troupe-elastic") {}

  void start(const std::string& name) {
    troupe::test::spawn_options o;
    o.output = (dir / (name + ".log")).string();
    // Each epoch, retirement and abort in the worker's log, shown when a check fails.
    o.env = {"TROUPE_LOG_LEVEL=info"};
    auto c = troupe::test::child_process::start(
        {TROUPE_ELASTIC_TEST_WORKER, server->url(), scope, name, std::to_string(heartbeat_ms),
         std::to_string(interval_ms)},
        o);
    REQUIRE_MESSAGE(c.started(), c.start_error());
    workers[name] = std::move(c);
  }

  // Sends `sig` to `name`; returns when (CLOCK_MONOTONIC ns).
  std::int64_t signal(const std::string& name, int sig) {
    const auto at = mono_ns();
    workers.at(name).signal(sig);
    return at;
  }

  std::optional<std::string> read(const std::string& key) {
    const std::string keys[] = {key};
    auto present = records->check(keys, 5s);
    if (!present || !*present) return std::nullopt;
    auto text = records->get_string(key, 5s);
    if (!text) return std::nullopt;
    return *text;
  }

  std::optional<progress> ok(const std::string& name) {
    auto text = read("ok/" + name);
    if (!text) return std::nullopt;
    std::istringstream in(*text);
    progress p;
    if (!(in >> p.epoch >> p.size >> p.ops)) return std::nullopt;
    return p;
  }

  std::optional<failure> failed(const std::string& name, int k) {
    auto text = read("failed/" + name + "/" + std::to_string(k));
    if (!text) return std::nullopt;
    failure f;
    auto nl = text->find('\n');
    std::istringstream head(text->substr(0, nl));
    head >> f.at_ns >> f.code;
    f.message = nl == std::string::npos ? "" : text->substr(nl + 1);
    return f;
  }

  // What each thread of `name` is doing (/proc: name, state, kernel wait channel and
  // system call), for a worker that did not exit when it should have.
  std::string threads_of(const std::string& name) {
    const auto pid = workers.at(name).pid();
    std::string out = name + " (pid " + std::to_string(pid) + ") threads:\n";
    std::error_code ec;
    const fs::path tasks = fs::path("/proc") / std::to_string(pid) / "task";
    for (const auto& t : fs::directory_iterator(tasks, ec)) {
      auto line = [&](const char* file) {
        std::ifstream f(t.path() / file);
        std::string text;
        std::getline(f, text);
        return text;
      };
      out += "  " + t.path().filename().string() + " " + line("comm") + ": stat " + line("stat") +
             "; wchan " + line("wchan") + "; syscall " + line("syscall") + "\n";
    }
    if (ec) out += "  (cannot list " + tasks.string() + ": " + ec.message() + ")\n";
    return out;
  }

  std::string logs() {
    std::string out;
    for (auto& [n, w] : workers) out += "--- " + n + ":\n" + w.output_text();
    return out;
  }

  // Waits until every worker in `names` runs good ops on a group of `size` members, all on
  // the same epoch, each with at least `ops` of them there; returns that epoch.
  std::uint64_t running(const std::vector<std::string>& names, int size, long ops = 10,
                        std::chrono::milliseconds timeout = 15s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string report;
    for (;;) {
      report.clear();
      bool all = true;
      std::optional<std::uint64_t> epoch;
      for (const auto& n : names) {
        auto p = ok(n);
        report += n + ": " +
                  (p ? "epoch " + std::to_string(p->epoch) + " size " + std::to_string(p->size) +
                           " ops " + std::to_string(p->ops)
                     : std::string("nothing")) +
                  "\n";
        if (!p || p->size != size || p->ops < ops || (epoch && *epoch != p->epoch)) all = false;
        if (p && !epoch) epoch = p->epoch;
      }
      for (const auto& n : names)
        if (auto bad = read("bad/" + n)) FAIL(n, " computed a wrong sum: ", *bad, "\n", logs());
      if (all) return *epoch;
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(20ms);
    }
    FAIL("the workers did not all run at world size ", size, " in time:\n", report, logs());
    return 0;
  }

  // The first op of `name` that failed after `since` (the earlier ones failed as the
  // workers joined): membership_changed, within the heartbeat timeout plus slack of
  // `since`, its message naming each of `named`.
  void check_changed(const std::string& name, std::int64_t since,
                     const std::vector<std::string>& named) {
    std::optional<failure> f;
    for (int k = 1;; ++k) {
      f = failed(name, k);
      if (!f || f->at_ns >= since) break;
    }
    REQUIRE_MESSAGE(f.has_value(), name, " reported no failed op after the change\n", logs());
    CAPTURE(name);
    CAPTURE(f->message);
    CHECK(f->code == "membership_changed");
    for (const auto& s : named) CHECK(f->message.find(s) != std::string::npos);
    const auto took_ms = (f->at_ns - since) / 1000000;
    CHECK(took_ms < heartbeat_ms + slack_ms);
    MESSAGE(name, "'s pending allreduce failed ", took_ms, " ms after the change");
  }

  // Milliseconds from `since` to `name`'s first good op in `epoch`.
  std::int64_t resumed_ms(const std::string& name, std::uint64_t epoch, std::int64_t since) {
    auto t = read("resumed/" + name + "/" + std::to_string(epoch));
    REQUIRE_MESSAGE(t.has_value(), name, " recorded no resumption in epoch ", epoch);
    return (std::stoll(*t) - since) / 1000000;
  }

  void stop_all(const std::vector<std::string>& names) {
    REQUIRE(records->set("stop", std::string_view("1")));
    for (const auto& n : names) {
      auto& w = workers.at(n);
      CAPTURE(n);
      CHECK(w.wait(20s));
      CHECK_MESSAGE(w.exit_code() == 0, w.output_text());
    }
  }
};

}  // namespace

TEST_CASE("four ranks allreduce in a loop on the group of their epoch and every sum is right") {
  job j;
  for (int r = 0; r < 4; ++r) j.start("worker" + std::to_string(r));
  j.running({"worker0", "worker1", "worker2", "worker3"}, 4, 30);
  j.stop_all({"worker0", "worker1", "worker2", "worker3"});
}

TEST_CASE(
    "a rank killed with SIGKILL mid-loop fails the survivors' pending allreduce with "
    "membership_changed within the heartbeat timeout, and they go on at world 3") {
  job j;
  for (int r = 0; r < 4; ++r) j.start("worker" + std::to_string(r));
  const std::vector<std::string> survivors{"worker0", "worker1", "worker3"};
  const auto before = j.running({"worker0", "worker1", "worker2", "worker3"}, 4);
  const auto killed = j.signal("worker2", SIGKILL);
  const auto after = j.running(survivors, 3);
  CHECK(after > before);
  for (const auto& s : survivors) {
    j.check_changed(s, killed,
                    {"left: worker2 (rank ", ", host ", "to epoch " + std::to_string(after)});
    const auto resumed = j.resumed_ms(s, after, killed);
    CHECK(resumed < heartbeat_ms + slack_ms);
    MESSAGE(s, " completed its first allreduce at world 3 ", resumed, " ms after the SIGKILL");
  }
  j.stop_all(survivors);
}

TEST_CASE("a worker that joins a running job is in the next epoch's group, with the others") {
  job j;
  for (int r = 0; r < 3; ++r) j.start("worker" + std::to_string(r));
  j.running({"worker0", "worker1", "worker2"}, 3);
  const auto joined = mono_ns();
  j.start("worker3");
  const std::vector<std::string> all{"worker0", "worker1", "worker2", "worker3"};
  j.running(all, 4);
  for (int r = 0; r < 3; ++r)
    j.check_changed("worker" + std::to_string(r), joined,
                    {"came: worker3 (rank 3, host "});  // joiners come last
  j.stop_all(all);
}

TEST_CASE(
    "a rank killed as another joins: the build for the join ends when the death's epoch arrives, "
    "and the job goes on at world 3") {
  job j;
  for (int r = 0; r < 3; ++r) j.start("worker" + std::to_string(r));
  j.running({"worker0", "worker1", "worker2"}, 3);
  const auto killed = j.signal("worker2", SIGKILL);
  j.start("worker3");
  // The join's epoch (with worker2) usually comes first; its build waits for worker2 in the
  // store until the epoch without it interrupts it. Far below the 20 s build timeout.
  const std::vector<std::string> now{"worker0", "worker1", "worker3"};
  const auto e = j.running(now, 3);
  for (const auto& s : {std::string("worker0"), std::string("worker1")}) {
    const auto resumed = j.resumed_ms(s, e, killed);
    CHECK(resumed < heartbeat_ms + slack_ms);
    MESSAGE(s, " ran its first allreduce at world 3 ", resumed, " ms after the SIGKILL");
  }
  j.stop_all(now);
}

TEST_CASE("two ranks killed at once leave two survivors that go on at world 2") {
  job j;
  for (int r = 0; r < 4; ++r) j.start("worker" + std::to_string(r));
  j.running({"worker0", "worker1", "worker2", "worker3"}, 4);
  const auto killed = j.signal("worker1", SIGKILL);
  j.signal("worker3", SIGKILL);
  const std::vector<std::string> survivors{"worker0", "worker2"};
  j.running(survivors, 2);
  for (const auto& s : survivors) j.check_changed(s, killed, {"left: worker"});
  j.stop_all(survivors);
}

TEST_CASE("the last survivor keeps working alone at world size 1") {
  job j;
  j.start("worker0");
  j.start("worker1");
  j.running({"worker0", "worker1"}, 2);
  const auto killed = j.signal("worker0", SIGKILL);
  j.running({"worker1"}, 1);
  j.check_changed("worker1", killed, {"left: worker0 (rank ", ", host "});
  j.stop_all({"worker1"});
}

TEST_CASE(
    "a rank stopped with SIGSTOP is declared dead, the survivors go on, and once continued it "
    "finds itself out") {
  job j;
  for (int r = 0; r < 3; ++r) j.start("worker" + std::to_string(r));
  j.running({"worker0", "worker1", "worker2"}, 3);
  const auto stopped = j.signal("worker1", SIGSTOP);
  const std::vector<std::string> survivors{"worker0", "worker2"};
  j.running(survivors, 2);
  for (const auto& s : survivors)
    j.check_changed(s, stopped, {"left: worker1 (rank ", ", host ", "heartbeat silent"});
  j.signal("worker1", SIGCONT);
  auto& w = j.workers.at("worker1");
  const bool exited = w.wait(15s);
  CHECK_MESSAGE(exited, "worker1 did not exit within 15 s of SIGCONT\n", j.threads_of("worker1"),
                j.logs());
  CHECK_MESSAGE(w.exit_code() == 3, w.output_text());
  auto evicted = j.read("evicted/worker1");
  REQUIRE(evicted.has_value());
  CHECK(evicted->find("membership_changed") != std::string::npos);
  CHECK(evicted->find("is not in epoch") != std::string::npos);
  j.stop_all(survivors);
}
