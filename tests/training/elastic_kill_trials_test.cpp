// Randomized SIGKILL trials of elastic training across real processes (training::elastic_loop
// over elastic gloo groups, a real TCP store on 127.0.0.1). Each trial starts three trainers
// (tests/training/elastic_training_worker.cpp), kills one or two with SIGKILL at a point
// drawn at random, starts replacements, and requires that the job finishes: every process
// not killed exits 0 in time, having run every step, with weights, momentum and ballast
// identical bit for bit, and every newcomer started from the survivors' state.
//
// The kill points (docs/testing.md, "Kill trials"):
//   allreduce     a trainer, a random moment after a random step: mostly mid-allreduce
//   broadcast     once a newcomer's group is built, after a random delay: the state's sender
//                 (rank 0 of that epoch) or the newcomer itself, while the state goes out
//   join          a trainer, a random delay after a newcomer starts joining
//   agreement     a trainer, then a second one a random delay later, around the moment the
//                 survivors agree on the epoch without the first
// The workers print a line per phase ("phase=joined ..."), and the library logs "built
// <group> for epoch <n> (<members>)" at info level; the test kills on seeing them.
//
// TROUPE_TEST_SEED replays a run (its seed is printed first); TROUPE_TEST_TRIALS changes the
// number of trials (20); TROUPE_TEST_VERBOSE=1 prints why each given-up build ended;
// TROUPE_TEST_KILL_POINT=<0-4> draws every trial from one kill point
// (in the order of the list above, broadcast counting as two: the sender, the newcomer).
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/strcat.hpp>
#include "support/store_job.hpp"

namespace {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

constexpr int trainers = 3;
constexpr int steps = 300;
// Floats of extra optimizer state: the broadcast to a newcomer takes long enough to be hit.
constexpr int ballast = 1 << 20;
// Every wait of a trial is bounded: a phase that does not come, a worker that does not exit.
constexpr auto phase_timeout = 30s;
constexpr auto finish_timeout = 60s;

enum class kill_point { allreduce, broadcast_sender, broadcast_newcomer, join, agreement };

const char* to_string(kill_point k) {
  switch (k) {
    case kill_point::allreduce:
      return "mid-allreduce";
    case kill_point::broadcast_sender:
      return "mid-broadcast, the sender";
    case kill_point::broadcast_newcomer:
      return "mid-broadcast, the newcomer";
    case kill_point::join:
      return "during a join";
    case kill_point::agreement:
      return "during an epoch agreement";
  }
  return "?";
}

// One trial, drawn before it runs so that it can be printed (and replayed from the seed).
struct plan {
  kill_point point = kill_point::allreduce;
  long at_step = 0;  // trainer0 has finished this many steps before anything happens
  int victim = 0;    // the trainer killed (allreduce, join, agreement's first)
  int second = 0;    // agreement: the second trainer killed
  std::chrono::milliseconds delay{0};  // from the phase's start to the kill

  std::string text() const {
    std::ostringstream o;
    o << to_string(point) << ": at step " << at_step << ", ";
    switch (point) {
      case kill_point::allreduce:
        o << "kill trainer" << victim << " after " << delay.count() << " ms";
        break;
      case kill_point::broadcast_sender:
      case kill_point::broadcast_newcomer:
        o << "start a newcomer, kill "
          << (point == kill_point::broadcast_sender ? "the sender" : "it") << " " << delay.count()
          << " ms after its group is built";
        break;
      case kill_point::join:
        o << "start a newcomer, kill trainer" << victim << " " << delay.count()
          << " ms after it starts joining";
        break;
      case kill_point::agreement:
        o << "kill trainer" << victim << ", then trainer" << second << " " << delay.count()
          << " ms later";
        break;
    }
    return o.str();
  }
};

// `only`: a kill point's number (0-4) to draw from alone, or -1 for all of them.
plan draw(std::mt19937_64& rng, long only) {
  auto uniform = [&](long lo, long hi) { return std::uniform_int_distribution<long>(lo, hi)(rng); };
  plan p;
  p.point = static_cast<kill_point>(only >= 0 && only <= 4 ? only : uniform(0, 4));
  p.at_step = uniform(10, 60);
  p.victim = static_cast<int>(uniform(0, trainers - 1));
  p.second = static_cast<int>((p.victim + uniform(1, trainers - 1)) % trainers);
  switch (p.point) {
    case kill_point::allreduce:
      p.delay = std::chrono::milliseconds(uniform(0, 20));
      break;
    case kill_point::broadcast_sender:
    case kill_point::broadcast_newcomer:
      p.delay = std::chrono::milliseconds(uniform(0, 40));
      break;
    case kill_point::join:
      p.delay = std::chrono::milliseconds(uniform(0, 200));
      break;
    // The survivors declare the first dead a heartbeat timeout (1 s) after its last beat.
    case kill_point::agreement:
      p.delay = std::chrono::milliseconds(uniform(700, 1400));
      break;
  }
  return p;
}

long env_number(const char* name, long otherwise) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : otherwise;
}

struct trial_job : troupe::test::store_job {
  std::set<std::string> killed;
  std::vector<std::string> newcomers;  // started after the trainers: must get the state

  trial_job() : store_job("elastic-kill-trials", "troupe-elastic-kill-trials") {}

  void start(const std::string& name) {
    troupe::test::spawn_options o;
    o.output = (dir / (name + ".log")).string();
    o.env = {"TROUPE_TEST_BALLAST=" + std::to_string(ballast), "TROUPE_LOG_LEVEL=info"};
    auto c = troupe::test::child_process::start(
        {TROUPE_ELASTIC_TRAINING_WORKER, server->url(), scope, name, std::to_string(steps)}, o);
    REQUIRE_MESSAGE(c.started(), c.start_error());
    workers[name] = std::move(c);
    if (!name.starts_with("trainer")) newcomers.push_back(name);
  }
  void kill(const std::string& name) {
    workers.at(name).signal(SIGKILL);
    killed.insert(name);
  }

  std::string output(const std::string& name) { return workers.at(name).output_text(); }
  // The first line of `name`'s output that contains `needle`.
  std::optional<std::string> line(const std::string& name, const std::string& needle) {
    std::istringstream in(output(name));
    for (std::string l; std::getline(in, l);)
      if (l.find(needle) != std::string::npos) return l;
    return std::nullopt;
  }

  std::optional<std::string> text(const std::string& key) {
    const std::string keys[] = {key};
    auto present = records->check(keys, 5s);
    if (!present || !*present) return std::nullopt;
    auto v = records->get(key, 5s);
    if (!v) return std::nullopt;
    return std::string(reinterpret_cast<const char*>(v->data()), v->size());
  }

  std::string logs() {
    std::string out;
    for (auto& [n, w] : workers)
      out += "--- " + n + (killed.contains(n) ? " (killed)" : "") + ":\n" + w.output_text();
    return out;
  }

  // Polls `ready` until it holds, up to phase_timeout; fails the test naming `what`.
  template <class Ready>
  void wait_for(const std::string& what, Ready ready) {
    const auto until = clk::now() + phase_timeout;
    while (!ready()) {
      if (clk::now() >= until) FAIL("no ", what, " within ", phase_timeout.count(), " s\n", logs());
      std::this_thread::sleep_for(1ms);
    }
  }
};

// The members of the epoch in "built group '...' for epoch 3 (a,b,c) in 12ms", rank order.
std::vector<std::string> built_members(const std::string& l) {
  std::vector<std::string> names;
  const auto at = l.find("for epoch ");
  const auto open = at == std::string::npos ? at : l.find('(', at);
  const auto close = open == std::string::npos ? open : l.find(')', open);
  if (close == std::string::npos) return names;
  std::istringstream in(l.substr(open + 1, close - open - 1));
  for (std::string n; std::getline(in, n, ',');) names.push_back(n);
  return names;
}

// Runs one trial; returns a line saying what the kill met.
std::string run_trial(trial_job& j, const plan& p) {
  for (int r = 0; r < trainers; ++r) j.start("trainer" + std::to_string(r));
  j.wait_for("progress to step " + std::to_string(p.at_step), [&] {
    auto s = j.text("progress/trainer0");
    return s && std::stol(*s) >= p.at_step;
  });
  const auto trainer = [](int r) { return "trainer" + std::to_string(r); };
  std::string met;
  switch (p.point) {
    case kill_point::allreduce: {
      std::this_thread::sleep_for(p.delay);
      j.kill(trainer(p.victim));
      met = "killed at step " + j.text("progress/trainer0").value_or("?");
      j.start("replacement1");
      break;
    }
    case kill_point::broadcast_sender:
    case kill_point::broadcast_newcomer: {
      j.start("newcomer");
      std::optional<std::string> built;
      j.wait_for("group built for the newcomer", [&] {
        built = j.line("newcomer", "built group");
        return built.has_value();
      });
      std::this_thread::sleep_for(p.delay);
      const auto members = built_members(*built);
      REQUIRE_MESSAGE(!members.empty(), "cannot read the members of: ", *built);
      const std::string victim =
          p.point == kill_point::broadcast_sender ? members.front() : std::string("newcomer");
      j.kill(victim);
      met = troupe::strcat("killed ", victim, " ",
                           j.line("newcomer", "phase=resized") ? "after" : "before",
                           " the newcomer had the state");
      j.start("replacement1");
      break;
    }
    case kill_point::join: {
      j.start("newcomer");
      j.wait_for("the newcomer joining", [&] { return j.line("newcomer", "phase=joining"); });
      std::this_thread::sleep_for(p.delay);
      j.kill(trainer(p.victim));
      met = j.line("newcomer", "phase=resized") ? "killed after the newcomer had the state"
            : j.line("newcomer", "phase=joined")
                ? "killed after the newcomer joined, before it had the state"
                : "killed before the newcomer's epoch";
      j.start("replacement1");
      break;
    }
    case kill_point::agreement: {
      const std::string first = trainer(p.victim);
      j.kill(first);
      j.start("replacement1");
      std::this_thread::sleep_for(p.delay);
      // Whether a survivor had seen the epoch without the first victim yet.
      bool agreed = false;
      for (int r = 0; r < trainers; ++r) {
        const auto name = trainer(r);
        if (j.killed.contains(name)) continue;
        std::istringstream in(j.output(name));
        for (std::string l; std::getline(in, l);)
          if (l.starts_with("phase=epoch ") && l.find(first) == std::string::npos) agreed = true;
      }
      j.kill(trainer(p.second));
      met = agreed ? "the second killed after the epoch without the first"
                   : "the second killed before the epoch without the first";
      j.start("replacement2");
      break;
    }
  }
  return met;
}

// The builds of an epoch's group that the workers gave up for a newer epoch (the library
// logs each at info level): one line each, "<worker>: <why>".
std::vector<std::string> builds_given_up(trial_job& j) {
  std::vector<std::string> out;
  for (auto& [name, w] : j.workers) {
    std::istringstream in(w.output_text());
    for (std::string l; std::getline(in, l);)
      if (auto at = l.find("group ended ("); at != std::string::npos)
        out.push_back(name + ": " + l.substr(at));
  }
  return out;
}

// Every worker not killed exits 0 having run every step, with the same final state, and
// every newcomer that finished began from the survivors' state (mid-training).
void check_finish(trial_job& j) {
  std::vector<std::string> finishers;
  const auto until = clk::now() + finish_timeout;
  for (auto& [name, w] : j.workers) {
    if (j.killed.contains(name)) continue;
    finishers.push_back(name);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now());
    CAPTURE(name);
    REQUIRE_MESSAGE(w.wait(std::max(left, 1ms)), "still running (a hang)\n", j.logs());
    REQUIRE_MESSAGE(w.exit_code() == 0, j.logs());
  }
  REQUIRE(finishers.size() >= 2);
  const auto reference = j.text("final/" + finishers.front());
  REQUIRE(reference.has_value());
  CHECK(reference->size() > ballast * sizeof(float));
  for (const auto& n : finishers) {
    CAPTURE(n);
    CHECK(j.text("progress/" + n) == std::to_string(steps));
    const auto mine = j.text("final/" + n);
    REQUIRE(mine.has_value());
    CHECK_MESSAGE(*mine == *reference, "the weights diverge\n", j.logs());
  }
  for (const auto& n : j.newcomers) {
    if (j.killed.contains(n)) continue;
    auto first = j.text("first/" + n);
    REQUIRE(first.has_value());
    CAPTURE(n);
    CHECK_MESSAGE(std::stol(*first) > 0, "it did not start from the survivors' state: ", *first);
  }
}

}  // namespace

TEST_CASE(
    "randomized trials (twenty, or six under the sanitizers) each SIGKILL a trainer at a random "
    "point of a live resize, and every time the job finishes with identical weights") {
  const auto seed = static_cast<std::uint64_t>(
      env_number("TROUPE_TEST_SEED", static_cast<long>(std::random_device{}() >> 1)));
  const long trials = env_number("TROUPE_TEST_TRIALS", 20);
  const long only = env_number("TROUPE_TEST_KILL_POINT", -1);
  std::cout << "kill trials: seed " << seed << " (replay with TROUPE_TEST_SEED=" << seed << ")"
            << std::endl;
  std::mt19937_64 rng(seed);
  for (long t = 1; t <= trials; ++t) {
    const plan p = draw(rng, only);
    std::cout << "trial " << t << "/" << trials << ": " << p.text() << std::endl;
    CAPTURE(seed);
    CAPTURE(t);
    INFO(p.text());
    const auto began = clk::now();
    trial_job j;
    const auto met = run_trial(j, p);
    check_finish(j);
    const auto took = std::chrono::duration<double>(clk::now() - began).count();
    const auto given_up = builds_given_up(j);
    std::cout << "trial " << t << ": finished in " << took << " s; " << met << "; "
              << given_up.size() << " group builds given up for a newer epoch" << std::endl;
    if (env_number("TROUPE_TEST_VERBOSE", 0) != 0)
      for (const auto& l : given_up) std::cout << "  " << l << "\n";
  }
}
