// A trainer of an elastic job for the multi-process tests of training::elastic_loop.
//
//   elastic_training_worker <store url> <scope> <name> <steps>
//
// Joins the membership under <scope>/membership (heartbeat timeout 1 s), then trains the MLP
// of examples/train with SGD and momentum on an elastic group: global step s uses the 64
// samples from (64 s) mod 2048, split evenly over the current world. Each worker starts
// from weights of its own (seeded by its name), so only the state broadcast makes them
// equal. Records under <scope>:
//   progress/<name>  the last step it finished (every step)
//   first/<name>     the step it first ran, and the world size then: "<step> <world>"
//   loss0/<name>     the full-data loss of the state it started step 0 from (if it did)
//   final/<name>     its final weights then momentum, raw floats
//   final_loss/<name>, groups/<name>, discarded/<name>
// Exits 0 when training ended (leaving the membership), 2 on failure.
//
// For tests that kill at a chosen point, it prints one line per phase to stdout, written
// at once ("phase=<what> key=value ..."): joining, joined, epoch (every epoch it sees, with
// its rank and the members in rank order), resized (after each state exchange) and done.
// Settings for those tests:
//   TROUPE_TEST_BALLAST       floats of extra optimizer state (seeded by the name, one
//                             entry changed per step), so the state broadcast takes a while
//   TROUPE_TEST_HEARTBEAT_MS  the membership's heartbeat timeout (default 1000)
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/training/elastic_loop.hpp>
#include "mlp.hpp"

using namespace std::chrono_literals;
using namespace troupe;
namespace ex = troupe::examples;

namespace {

// One phase line on stdout, in one write so that lines of different threads never mix.
void mark(const std::string& line) {
  const std::string out = "phase=" + line + "\n";
  [[maybe_unused]] auto n = ::write(STDOUT_FILENO, out.data(), out.size());
}

long env_number(const char* name, long otherwise) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : otherwise;
}

std::string describe_epoch(const membership::epoch& e, const std::string& name) {
  const auto* me = e.find(name);
  return strcat("epoch=", e.number, " rank=", me != nullptr ? me->rank : -1,
                " members=", e.names());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: elastic_training_worker <url> <scope> <name> <steps>\n";
    return 2;
  }
  const std::string url = argv[1], scope = argv[2], name = argv[3];
  const std::int64_t steps = std::stoll(argv[4]);
  store_options so;
  so.connect_timeout = 10s;
  so.timeout = 20s;
  auto opened = connect_store(url, so);
  if (!opened) {
    std::cerr << name << ": " << opened.error() << "\n";
    return 2;
  }
  std::shared_ptr<store> base = std::move(*opened);
  auto records = std::make_shared<prefix_store>(base, scope);
  auto put = [&](const std::string& key, const std::string& value) {
    (void)records->set(key, std::string_view(value));
  };

  membership::service_options mo;
  mo.name = name;
  mo.heartbeat_timeout = std::chrono::milliseconds(env_number("TROUPE_TEST_HEARTBEAT_MS", 1000));
  mo.heartbeat_interval = mo.heartbeat_timeout / 10;
  mo.op_timeout = 5s;
  mark("joining");
  auto joined = membership::service::join(
      std::make_shared<prefix_store>(base, scope + "/membership"), mo, 20s);
  if (!joined) {
    std::cerr << name << ": joining: " << joined.error() << "\n";
    return 2;
  }
  std::shared_ptr<membership::service> svc = std::move(*joined);
  mark("joined " + describe_epoch(svc->current(), name));
  svc->on_epoch([name](const membership::epoch&, const membership::epoch& after) {
    mark("epoch " + describe_epoch(after, name));
  });
  collectives::elastic_options eo;
  eo.name = scope + "/elastic";
  auto eg = collectives::elastic_group::make(svc, base, eo);
  if (!eg) {
    std::cerr << name << ": " << eg.error() << "\n";
    return 2;
  }

  constexpr int samples = 2048, batch = 64, features = 16, hidden = 32, classes = 4;
  constexpr float lr = 0.05f, momentum = 0.9f;
  const auto data = ex::make_dataset(samples, features, classes, 7);
  ex::mlp model(features, hidden, classes, std::hash<std::string>{}(name));
  std::vector<float> velocity(model.w.size(), 0.f);
  std::vector<float> ballast(static_cast<std::size_t>(env_number("TROUPE_TEST_BALLAST", 0)));
  ex::rng ballast_rng{std::hash<std::string>{}(name) + 1};
  for (auto& b : ballast) b = ballast_rng.uniform();
  auto full_loss = [&] {
    auto probe = model;
    return probe.train_batch(data, 0, samples);
  };

  training::elastic_loop_options lo;
  lo.steps = steps;
  lo.timeout = 60s;
  bool first = true;
  lo.on_resize = [&](const training::elastic_step& next, const membership::epoch&) {
    mark(strcat("resized step=", next.step, " world=", next.world, " epoch=", next.epoch,
                " rank=", next.rank));
    if (!first) return;
    first = false;
    put("first/" + name, std::to_string(next.step) + " " + std::to_string(next.world));
    if (next.step == 0) put("loss0/" + name, std::to_string(full_loss()));
  };
  std::vector<tensor_view> optimizer_state{tensor_view::of(std::span(velocity))};
  if (!ballast.empty()) optimizer_state.push_back(tensor_view::of(std::span(ballast)));
  auto loop = training::elastic_loop::make(**eg, model.parameters(), optimizer_state, lo);
  if (!loop) {
    std::cerr << name << ": " << loop.error() << "\n";
    return 2;
  }
  auto r = (*loop)->run(
      [&](const training::elastic_step& s) -> expected<void> {
        const auto [b, e] = training::split_evenly(batch, s.rank, s.world);
        const int from = static_cast<int>((s.step * batch) % samples);
        model.zero_grad();
        if (e > b) model.train_batch(data, from + static_cast<int>(b), from + static_cast<int>(e));
        std::this_thread::sleep_for(5ms);  // a step takes a moment, so a kill lands mid-run
        return ok();
      },
      [&](const training::elastic_step& s) -> expected<void> {
        for (std::size_t i = 0; i < model.w.size(); ++i) {
          velocity[i] = momentum * velocity[i] + model.g[i];
          model.w[i] -= lr * velocity[i];
        }
        if (!ballast.empty()) ballast[static_cast<std::size_t>(s.step) % ballast.size()] += 1.f;
        put("progress/" + name, std::to_string(s.step + 1));
        return ok();
      });
  if (!r) {
    std::cerr << name << ": " << r.error() << "\n";
    return 2;
  }
  std::vector<float> final_state = model.w;
  final_state.insert(final_state.end(), velocity.begin(), velocity.end());
  final_state.insert(final_state.end(), ballast.begin(), ballast.end());
  (void)records->set("final/" + name, std::as_bytes(std::span(final_state)));
  put("final_loss/" + name, std::to_string(full_loss()));
  put("groups/" + name, std::to_string((*loop)->groups()));
  put("discarded/" + name, std::to_string((*loop)->discarded()));
  (*eg)->shutdown(5s);
  if (auto left = svc->shutdown(10s); !left) {
    std::cerr << name << ": leaving: " << left.error() << "\n";
    return 2;
  }
  mark("done");
  return 0;
}
