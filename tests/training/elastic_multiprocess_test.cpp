// Elastic training across real processes (training::elastic_loop over an elastic gloo
// group, a real TCP store on 127.0.0.1): a trainer is killed with SIGKILL mid-training and
// a replacement joins; everyone ends with the same weights and a lower loss.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
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

struct job : troupe::test::store_job {
  job() : store_job("elastic-training", "troupe-elastic-training") {}

  void start(const std::string& name, int steps) {
    troupe::test::spawn_options o;
    o.output = (dir / (name + ".log")).string();
    auto c = troupe::test::child_process::start(
        {TROUPE_ELASTIC_TRAINING_WORKER, server->url(), scope, name, std::to_string(steps)}, o);
    REQUIRE_MESSAGE(c.started(), c.start_error());
    workers[name] = std::move(c);
  }

  std::optional<troupe::bytes> read(const std::string& key) {
    const std::string keys[] = {key};
    auto present = records->check(keys, 5s);
    if (!present || !*present) return std::nullopt;
    auto v = records->get(key, 5s);
    if (!v) return std::nullopt;
    return *v;
  }
  std::optional<std::string> text(const std::string& key) {
    auto v = read(key);
    if (!v) return std::nullopt;
    return std::string(reinterpret_cast<const char*>(v->data()), v->size());
  }

  std::string logs() {
    std::string out;
    for (auto& [n, w] : workers) out += "--- " + n + ":\n" + w.output_text();
    return out;
  }

  // Waits until `name` has finished at least `step` steps.
  void wait_progress(const std::string& name, long step, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (auto p = text("progress/" + name); p && std::stol(*p) >= step) return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL(name, " did not reach step ", step, " in time\n", logs());
  }
};

}  // namespace

TEST_CASE(
    "a trainer killed mid-training is replaced by a newcomer that gets the state, and all end with "
    "identical weights and a lower loss") {
  constexpr int steps = 400;
  job j;
  for (int r = 0; r < 3; ++r) j.start("trainer" + std::to_string(r), steps);
  j.wait_progress("trainer0", 80, 20s);
  j.workers.at("trainer1").signal(SIGKILL);
  j.start("replacement", steps);
  const std::vector<std::string> finishers{"trainer0", "trainer2", "replacement"};
  for (const auto& n : finishers) {
    auto& w = j.workers.at(n);
    CAPTURE(n);
    REQUIRE_MESSAGE(w.wait(40s), j.logs());
    REQUIRE_MESSAGE(w.exit_code() == 0, j.logs());
  }
  // Identical weights and momentum, bit for bit.
  auto reference = j.read("final/trainer0");
  REQUIRE(reference.has_value());
  CHECK(reference->size() > 1000 * sizeof(float));
  for (const auto& n : finishers) {
    auto mine = j.read("final/" + n);
    REQUIRE(mine.has_value());
    CAPTURE(n);
    CHECK(*mine == *reference);
  }
  // The replacement started mid-training, from the survivors' state.
  auto first = j.text("first/replacement");
  REQUIRE(first.has_value());
  std::istringstream in(*first);
  long first_step = 0;
  int world = 0;
  in >> first_step >> world;
  CHECK(first_step > 0);
  CHECK(first_step < steps);
  // The loss fell from where training started.
  std::optional<double> loss0;
  for (int r = 0; r < 3 && !loss0; ++r)
    if (auto l = j.text("loss0/trainer" + std::to_string(r))) loss0 = std::stod(*l);
  REQUIRE(loss0.has_value());
  const double final_loss = std::stod(*j.text("final_loss/trainer0"));
  CHECK(final_loss < 0.8 * *loss0);
  MESSAGE("loss ", *loss0, " -> ", final_loss, "; the replacement first ran step ", first_step,
          " at world ", world, "; trainer0 trained on ", *j.text("groups/trainer0"),
          " groups and discarded ", *j.text("discarded/trainer0"), " step attempts");
}
