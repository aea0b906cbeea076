#include "elastic_train.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include <troupe/core/strcat.hpp>
#include <troupe/training/elastic_loop.hpp>

namespace troupe::examples {

namespace {

using namespace troupe::collectives;

long long wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int fail(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), what.c_str());
  return 1;
}

// The mean loss over the whole data set, on a copy (train_batch adds into the gradients).
float full_loss(const mlp& model, const dataset& data) {
  auto probe = model;
  return probe.train_batch(data, 0, data.size());
}

}  // namespace

std::vector<float> replay_elastic(const dataset& d, const std::vector<int>& worlds,
                                  int global_batch, float lr, std::uint64_t seed, int in,
                                  int hidden, int out) {
  mlp m(in, hidden, out, seed);
  const int steps_per_epoch = d.size() / global_batch;
  std::vector<float> sum(m.g.size());
  for (std::size_t step = 0; step < worlds.size(); ++step) {
    const int world = worlds[step];
    const int from =
        static_cast<int>(step % static_cast<std::size_t>(steps_per_epoch)) * global_batch;
    for (int r = 0; r < world; ++r) {
      const auto [b, e] = training::split_evenly(global_batch, r, world);
      m.zero_grad();
      if (e > b) m.train_batch(d, from + static_cast<int>(b), from + static_cast<int>(e));
      fold_in_rank_order(sum, m.g, r);
    }
    for (std::size_t k = 0; k < sum.size(); ++k) m.g[k] = sum[k] / static_cast<float>(world);
    m.sgd(lr);
  }
  return m.w;
}

int train_elastic(world& w, const elastic_settings& s) {
  const std::string me = strcat("worker", w.env().rank);
  auto* eg = w.elastic();
  if (eg == nullptr) return fail(me, "train_elastic needs an elastic world (TROUPE_ELASTIC=1)");
  const int launched = w.env().world_size;
  const int global_batch = s.batch * launched;
  if (global_batch > s.samples)
    return fail(me, strcat("--batch ", s.batch, " x ", launched, " workers = ", global_batch,
                           " samples per step, more than --samples ", s.samples));
  const int steps_per_epoch = s.samples / global_batch;
  const std::int64_t steps = static_cast<std::int64_t>(s.epochs) * steps_per_epoch;
  const std::uint64_t seed = s.seed != 0 ? s.seed : std::hash<std::string>{}(w.env().run_id) | 1u;
  const std::uint64_t data_seed = 7, model_seed = 11;
  auto data = make_dataset(s.samples, s.features, s.classes, data_seed);
  // One seed for every member: the loop's state broadcast makes a newcomer equal to the
  // others anyway, and the replay starts from the same weights.
  mlp model(s.features, s.hidden, s.classes, model_seed);

  // The planned death: a launched rank other than 0, at a step in the middle half, on the
  // first start only (its replacement trains on).
  int victim = -1;
  std::int64_t kill_step = -1;
  if (s.kill_one && launched > 1) {
    std::uint64_t mix = seed * 0x9E3779B97F4A7C15ull;  // spread nearby seeds apart
    mix ^= mix >> 29;
    victim = 1 + static_cast<int>(mix % static_cast<std::uint64_t>(launched - 1));
    kill_step = steps / 4 +
                static_cast<std::int64_t>(
                    (mix >> 20) % static_cast<std::uint64_t>(std::max<std::int64_t>(1, steps / 2)));
  }
  const bool doomed = w.env().rank == victim && w.env().restart_count == 0;
  std::mt19937_64 jitter(seed ^ static_cast<std::uint64_t>(w.env().rank));
  if (w.rank() == 0 && w.env().restart_count == 0) {
    std::printf(
        "elastic training of a %d-%d-%d MLP: %lld steps of %d samples (%d epochs of %d "
        "samples), each split over the members of the current epoch; seed %llu\n",
        s.features, s.hidden, s.classes, static_cast<long long>(steps), global_batch, s.epochs,
        s.samples, static_cast<unsigned long long>(seed));
    if (victim >= 0)
      std::printf("worker%d will kill itself with SIGKILL at step %lld (--kill-one)\n", victim,
                  static_cast<long long>(kill_step));
    std::fflush(stdout);
  }

  // The world size of every step this member applied, by step (a redone step overwrites).
  std::vector<int> worlds(static_cast<std::size_t>(steps), 0);
  std::int64_t first_step = -1;
  bool resized = false;  // a step completed after the last resize is reported
  if (s.recovery_report && w.env().restart_count > 0) {
    std::printf("recovery: %s started at %lld\n", me.c_str(), s.started_ns);
    std::fflush(stdout);
  }
  // A first start waits (bounded) for every launched worker to join, as a launcher's
  // rendezvous would: a worker that started alone would otherwise train the first steps by
  // itself, and if it were the one killed, no survivor would have run every step. A
  // replacement joins a running job and does not wait.
  if (w.env().restart_count == 0 && w.membership()) {
    auto all = w.membership()->wait_until(
        [&](const membership::epoch& e) { return e.size() >= static_cast<std::size_t>(launched); },
        s.timeout);
    if (!all && w.rank() == 0)
      std::printf("not every launched worker joined within %s; training with those that did\n",
                  format_duration(s.timeout).c_str());
  }
  training::elastic_loop_options lo;
  lo.steps = steps;
  lo.timeout = s.timeout;
  lo.rebuild_timeout = s.timeout;
  lo.on_resize = [&](const training::elastic_step& next, const membership::epoch& e) {
    if (first_step < 0) first_step = next.step;
    resized = true;
    if (next.rank == 0)
      std::printf("epoch %llu of the membership: %zu workers (%s) from step %lld; cause: %s\n",
                  static_cast<unsigned long long>(e.number), e.size(), e.names().c_str(),
                  static_cast<long long>(next.step), e.cause.c_str());
    std::fflush(stdout);
  };
  auto loop = training::elastic_loop::make(*eg, model.parameters(), {}, lo);
  if (!loop) return fail(me, loop.error().to_string());
  auto r = (*loop)->run(
      [&](const training::elastic_step& st) -> expected<void> {
        if (doomed && st.step == kill_step) {
          std::fprintf(stderr, "%s: killing itself with SIGKILL at step %lld (--kill-one)\n",
                       me.c_str(), static_cast<long long>(st.step));
          std::fflush(stderr);
          // A moment into the step, so that the others are sometimes mid-allreduce.
          std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 2000));
          if (s.recovery_report) {
            std::printf("recovery: %s killed at %lld (step %lld)\n", me.c_str(), wall_ns(),
                        static_cast<long long>(st.step));
            std::fflush(stdout);
          }
          ::raise(SIGKILL);
        }
        const auto [b, e] = training::split_evenly(global_batch, st.rank, st.world);
        const int from = static_cast<int>(st.step % steps_per_epoch) * global_batch;
        model.zero_grad();
        if (e > b) model.train_batch(data, from + static_cast<int>(b), from + static_cast<int>(e));
        return ok();
      },
      [&](const training::elastic_step& st) -> expected<void> {
        model.sgd(s.lr);
        worlds[static_cast<std::size_t>(st.step)] = st.world;
        if (resized && s.recovery_report) {
          std::printf("recovery: %s completed step %lld at %lld (epoch %llu, world %d)\n",
                      me.c_str(), static_cast<long long>(st.step), wall_ns(),
                      static_cast<unsigned long long>(st.epoch), st.world);
          std::fflush(stdout);
        }
        resized = false;
        if ((st.step + 1) % steps_per_epoch == 0 && st.rank == 0)
          std::printf("epoch %lld/%d: loss %.4f with %d workers\n",
                      static_cast<long long>((st.step + 1) / steps_per_epoch), s.epochs,
                      full_loss(model, data), st.world);
        std::fflush(stdout);
        return ok();
      });
  if (!r) return fail(me, r.error().to_string());

  // Every member holds the same weights as the final group's rank 0, bit for bit...
  auto v = eg->current();
  auto& g = *v.group;
  std::vector<float> theirs = model.w;
  broadcast_options bo;
  bo.timeout = s.timeout;
  if (auto b = g.broadcast(tensor_view::of(std::span(theirs)), bo).wait(s.timeout); !b)
    return fail(me, "comparing weights: " + b.error().to_string());
  const bool complete = first_step == 0;
  std::vector<float> replayed;
  if (complete)
    replayed = replay_elastic(data, worlds, global_batch, s.lr, model_seed, s.features, s.hidden,
                              s.classes);
  double max_diff = 0;
  for (std::size_t i = 0; i < replayed.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(replayed[i] - model.w[i])));
  // [members whose weights differ from rank 0's, members that replayed, the worst replay]
  double differ[2] = {
      std::memcmp(theirs.data(), model.w.data(), theirs.size() * sizeof(float)) != 0 ? 1.0 : 0.0,
      complete ? 1.0 : 0.0};
  allreduce_options ao;
  ao.timeout = s.timeout;
  if (auto a = g.allreduce(tensor_view::of(std::span<double>(differ, 2)), ao).wait(s.timeout); !a)
    return fail(me, "comparing weights: " + a.error().to_string());
  ao.op = reduce_op::max;
  if (auto a = g.allreduce(tensor_view::of(std::span<double>(&max_diff, 1)), ao).wait(s.timeout);
      !a)
    return fail(me, "comparing with the replay: " + a.error().to_string());
  if (differ[0] > 0)
    return fail(me, strcat(differ[0], " workers hold weights that differ from rank 0's"));
  if (differ[1] < 1) return fail(me, "no worker ran every step, so none could replay the run");
  if (!(max_diff <= s.tolerance))
    return fail(me, strcat("the weights differ from a single-process replay of the same steps "
                           "and world sizes by up to ",
                           max_diff, ", above the tolerance ", s.tolerance));
  // Nobody leaves (a new epoch, which aborts this group) before everyone is done with it.
  const std::string done = strcat("train_demo/done/", v.epoch.number, "/");
  if (auto d = w.store()->set(done + me, std::string_view("1")); !d)
    return fail(me, "store: " + d.error().to_string());
  std::vector<std::string> everyone;
  for (const auto& m : v.epoch.members) everyone.push_back(done + m.name);
  if (auto met = w.store()->wait(everyone, s.timeout); !met)
    return fail(me, "waiting for the others to finish: " + met.error().to_string());
  if (g.rank() == 0) {
    std::printf(
        "all %d worker(s) hold identical weights; max |w - w_replay| = %.2g (tolerance "
        "%.0e) over %lld steps: the elastic run matches a single-process replay of its "
        "world sizes; steps discarded here: %lld, groups: %lld\n",
        g.size(), max_diff, s.tolerance, static_cast<long long>(steps),
        static_cast<long long>((*loop)->discarded()), static_cast<long long>((*loop)->groups()));
    std::fflush(stdout);
  }
  if (auto sd = w.shutdown(); !sd) return fail(me, "shutdown: " + sd.error().to_string());
  return 0;
}

}  // namespace troupe::examples
