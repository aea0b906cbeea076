// DDP scenarios run by every rank of a group, as threads (ddp_test.cpp) or as processes
// (training_test_worker.cpp). Each returns "" on success, else what went wrong.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <troupe/collectives/join.hpp>
#include <troupe/training/ddp.hpp>
#include "mlp.hpp"

namespace troupe::training::testing {

using namespace std::chrono_literals;
using collectives::join;
using collectives::process_group;

/// Parameters in separate buffers (not contiguous), sizes 3, 5, 2, 7, with grads set by
/// the caller.
struct loose_model {
  std::vector<std::vector<float>> w, g;
  explicit loose_model(float init) {
    for (std::size_t n : {3u, 5u, 2u, 7u}) {
      w.emplace_back(n, init);
      g.emplace_back(n, 0.f);
    }
  }
  std::vector<parameter> parameters() {
    std::vector<parameter> ps;
    for (std::size_t k = 0; k < w.size(); ++k)
      ps.push_back({"p" + std::to_string(k), tensor_view::of(std::span(w[k])),
                    tensor_view::of(std::span(g[k]))});
    return ps;
  }
  /// Gradient element i of parameter k on `rank`: small integers, exact in float.
  static float grad_of(int rank, std::size_t k, std::size_t i) {
    return static_cast<float>(rank * 10 + static_cast<int>(k) * 3 + static_cast<int>(i) % 4);
  }
  void set_grads(int rank, float times = 1) {
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k][i] += times * grad_of(rank, k, i);
  }
  /// The mean over `world` ranks of grad_of(.., k, i) times `times`.
  static float mean_grad(int world, std::size_t k, std::size_t i, float times = 1) {
    float s = 0;
    for (int r = 0; r < world; ++r) s += grad_of(r, k, i);
    return times * s / static_cast<float>(world);
  }
};

inline ddp_options small_buckets() {
  ddp_options o;
  o.first_bucket_cap_bytes = 16;  // p3 alone
  o.bucket_cap_bytes = 24;        // then {p2, p1} and {p0}
  o.timeout = 10s;
  return o;
}

/// Training the MLP with uneven shards under Join equals the one-process computation,
/// with several buckets; every rank ends with identical weights.
inline std::string ddp_matches_single_process(std::shared_ptr<process_group> g) {
  const int samples = 600, batch = 16, epochs = 2, in = 8, hidden = 16, out = 3;
  const float lr = 0.2f;
  auto data = examples::make_dataset(samples, in, out, 3);
  examples::mlp m(in, hidden, out, 5 + static_cast<std::uint64_t>(g->rank()));
  ddp_options o;
  o.first_bucket_cap_bytes = 64;
  o.bucket_cap_bytes = 256;
  o.timeout = 10s;
  auto d = ddp::make(g, m.parameters(), o);
  if (!d) return "make: " + d.error().to_string();
  if ((*d)->bucket_plans().size() < 2) return "expected several buckets";
  auto [begin, end] = examples::shard(samples, g->rank(), g->size());
  for (int e = 0; e < epochs; ++e) {
    auto j = join::make({d->get()});
    if (!j) return "join: " + j.error().to_string();
    auto r = j->run([&]() -> expected<void> {
      for (int b = begin; b < end; b += batch) {
        m.zero_grad();
        expected<void> marked;
        m.train_batch(data, b, std::min(end, b + batch), [&](std::size_t k) {
          if (marked) marked = (*d)->mark_ready(k);
        });
        TROUPE_TRY(marked);
        TROUPE_TRY((*d)->finish_step());
        m.sgd(lr);
      }
      return ok();
    });
    if (!r) return "epoch: " + r.error().to_string();
  }
  auto ref = examples::reference_training(data, g->size(), epochs, batch, lr, 5, in, hidden, out);
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::fabs(ref[i] - m.w[i]) > 1e-5f)
      return strcat("weight ", i, " is ", m.w[i], ", one process computes ", ref[i]);
  auto zero = (*d)->broadcast_object(m.w, 0);
  if (!zero) return zero.error().to_string();
  if (*zero != m.w) return "ranks hold different weights";
  return {};
}

/// make() gives every rank rank 0's weights; grads kept in separate buffers are bucketed
/// by copy and averaged exactly.
inline std::string ddp_broadcasts_and_averages(std::shared_ptr<process_group> g) {
  loose_model m(static_cast<float>(g->rank() + 1));
  auto d = ddp::make(g, m.parameters(), small_buckets());
  if (!d) return "make: " + d.error().to_string();
  for (auto& w : m.w)
    for (float v : w)
      if (v != 1.f) return "weights were not broadcast from rank 0";
  if ((*d)->bucket_plans().size() < 3) return "expected at least 3 buckets";
  if ((*d)->bucket_plans().front().params.front() != 3)
    return "first bucket is not the last parameter";
  m.set_grads(g->rank());
  if (auto r = (*d)->sync_gradients(); !r) return "sync: " + r.error().to_string();
  for (std::size_t k = 0; k < m.g.size(); ++k)
    for (std::size_t i = 0; i < m.g[k].size(); ++i)
      if (m.g[k][i] != loose_model::mean_grad(g->size(), k, i))
        return strcat("grad ", k, "[", i, "] = ", m.g[k][i], ", want ",
                      loose_model::mean_grad(g->size(), k, i));
  if ((*d)->steps() != 1) return "steps() is not 1";
  return {};
}

/// Under no_sync gradients accumulate locally; the next synchronized step averages the sum.
inline std::string ddp_no_sync_accumulates(std::shared_ptr<process_group> g) {
  loose_model m(0);
  auto d = ddp::make(g, m.parameters(), small_buckets());
  if (!d) return "make: " + d.error().to_string();
  {
    auto guard = (*d)->no_sync();
    for (int s = 0; s < 3; ++s) {
      m.set_grads(g->rank());
      if (auto r = (*d)->sync_gradients(); !r) return "no_sync step: " + r.error().to_string();
    }
  }
  // Nothing was communicated: each rank still has its own accumulated gradient.
  for (std::size_t k = 0; k < m.g.size(); ++k)
    for (std::size_t i = 0; i < m.g[k].size(); ++i)
      if (m.g[k][i] != 3 * loose_model::grad_of(g->rank(), k, i))
        return "a no_sync step changed the gradients";
  if ((*d)->steps() != 0) return "no_sync steps were counted";
  m.set_grads(g->rank());
  if (auto r = (*d)->sync_gradients(); !r) return "sync: " + r.error().to_string();
  for (std::size_t k = 0; k < m.g.size(); ++k)
    for (std::size_t i = 0; i < m.g[k].size(); ++i)
      if (m.g[k][i] != loose_model::mean_grad(g->size(), k, i, 4))
        return strcat("accumulated grad ", k, "[", i, "] = ", m.g[k][i], ", want ",
                      loose_model::mean_grad(g->size(), k, i, 4));
  return {};
}

/// Each built-in hook and a user hook leave the average gradient in every bucket.
inline std::string ddp_comm_hooks(std::shared_ptr<process_group> g) {
  struct variant {
    const char* name;
    comm_hook hook;
    float tolerance;
    std::uint16_t (*round)(float);
    float (*back)(std::uint16_t);
  };
  std::vector<variant> vs{{"allreduce", allreduce_hook(), 1e-6f, nullptr, nullptr},
                          {"fp16_compress", fp16_compress_hook(), 2e-3f, collectives::float_to_half,
                           collectives::half_to_float},
                          {"bf16_compress", bf16_compress_hook(), 1e-2f,
                           collectives::float_to_bfloat16, collectives::bfloat16_to_float}};
  for (auto& v : vs) {
    auto found = find_comm_hook(v.name);
    if (!found) return found.error().to_string();
    loose_model m(0);
    auto o = small_buckets();
    o.hook = v.hook;
    auto d = ddp::make(g, m.parameters(), o);
    if (!d) return "make: " + d.error().to_string();
    // Values with many significant digits, so compression shows.
    for (std::size_t k = 0; k < m.g.size(); ++k)
      for (std::size_t i = 0; i < m.g[k].size(); ++i)
        m.g[k][i] = loose_model::grad_of(g->rank(), k, i) * 1.0123457f;
    if (auto r = (*d)->sync_gradients(); !r) return v.name + (": " + r.error().to_string());
    for (std::size_t k = 0; k < m.g.size(); ++k)
      for (std::size_t i = 0; i < m.g[k].size(); ++i) {
        float want = loose_model::mean_grad(g->size(), k, i) * 1.0123457f;
        float got = m.g[k][i];
        if (std::fabs(got - want) > v.tolerance * std::fabs(want) + 1e-6f)
          return strcat(v.name, ": grad ", k, "[", i, "] = ", got, ", want ", want);
        if (v.round && v.back(v.round(got)) != got)
          return strcat(v.name, ": ", got, " is not a 16-bit value; nothing was compressed");
      }
  }
  if (find_comm_hook("fp8")) return "an unknown hook name was accepted";
  // A user hook: called once per bucket in order; it sums and halves instead of averaging.
  loose_model m(0);
  auto o = small_buckets();
  std::vector<std::size_t> calls;
  o.hook = [&calls](comm_bucket b) {
    calls.push_back(b.index);
    return b.group->allreduce(b.buffer, {collectives::reduce_op::sum, b.timeout})
        .get_future()
        .then([b] { (void)scale(b.buffer, 0.5); });
  };
  auto d = ddp::make(g, m.parameters(), o);
  if (!d) return "make: " + d.error().to_string();
  m.set_grads(g->rank());
  if (auto r = (*d)->sync_gradients(); !r) return "user hook: " + r.error().to_string();
  std::vector<std::size_t> want_calls;
  for (std::size_t b = 0; b < (*d)->bucket_plans().size(); ++b) want_calls.push_back(b);
  if (calls != want_calls) return "the user hook was not called once per bucket in order";
  float want = loose_model::mean_grad(g->size(), 1, 2) * static_cast<float>(g->size()) * 0.5f;
  if (m.g[1][2] != want) return strcat("user hook result ", m.g[1][2], ", want ", want);
  return {};
}

/// Post-local SGD with period 2 and warm-up 3: steps 0-2 all-reduce gradients; from step
/// 3 gradients stay local and the weights are averaged at steps 3, 5 and 7.
inline std::string ddp_model_averaging(std::shared_ptr<process_group> g) {
  loose_model m(0);
  auto o = small_buckets();
  o.averaging = averaging_options{2, 3};
  auto d = ddp::make(g, m.parameters(), o);
  if (!d) return "make: " + d.error().to_string();
  auto bad = o;
  bad.averaging = averaging_options{0, 3};
  loose_model other(0);
  if (auto refused = ddp::make(g, other.parameters(), bad); refused) return "period 0 accepted";
  std::vector<int> averaged_at;
  for (int step = 0; step < 8; ++step) {
    for (auto& gr : m.g) std::fill(gr.begin(), gr.end(), 0.f);
    m.set_grads(g->rank());
    if (auto r = (*d)->sync_gradients(); !r) return "sync: " + r.error().to_string();
    bool reduced = m.g[2][1] == loose_model::mean_grad(g->size(), 2, 1);
    bool local = m.g[2][1] == loose_model::grad_of(g->rank(), 2, 1);
    if (step < 3 && !reduced) return strcat("step ", step, " did not all-reduce in warm-up");
    if (step >= 3 && !local) return strcat("step ", step, " communicated gradients after warm-up");
    for (std::size_t k = 0; k < m.w.size(); ++k)  // SGD with lr 1
      for (std::size_t i = 0; i < m.w[k].size(); ++i) m.w[k][i] -= m.g[k][i];
    auto avg = (*d)->after_optimizer_step();
    if (!avg) return "average: " + avg.error().to_string();
    if (*avg) averaged_at.push_back(step);
    // After an averaging every rank holds the same weights.
    auto w0 = (*d)->broadcast_object(m.w[2], 0);
    if (!w0) return w0.error().to_string();
    bool same = *w0 == m.w[2];
    if ((step < 3 || *avg) && !same) return strcat("weights differ after step ", step);
    if (step >= 3 && !*avg && g->size() > 1 && g->rank() > 0 && same)
      return strcat("weights agree after a local step ", step);
  }
  if (averaged_at != std::vector<int>{3, 5, 7}) return "averaged at the wrong steps";
  if ((*d)->averagings() != 3) return "averagings() is not 3";
  return {};
}

/// A parameter never marked is an error without find_unused_parameters, zero with it.
inline std::string ddp_unused_parameters(std::shared_ptr<process_group> g) {
  loose_model m(0);
  auto o = small_buckets();
  o.find_unused_parameters = true;
  auto d = ddp::make(g, m.parameters(), o);
  if (!d) return "make: " + d.error().to_string();
  m.set_grads(g->rank());
  for (std::size_t k : {3u, 1u, 0u})
    if (auto r = (*d)->mark_ready(k); !r) return r.error().to_string();
  if (auto r = (*d)->mark_ready(3); r) return "a parameter was marked twice";
  if (auto r = (*d)->finish_step(); !r) return "finish: " + r.error().to_string();
  for (float v : m.g[2])
    if (v != 0) return "the unused parameter's gradient is not zero";
  if (m.g[3][0] != loose_model::mean_grad(g->size(), 3, 0)) return "used gradient not averaged";
  // Without the option the step is refused, naming the parameter (on every rank alike).
  loose_model strict(0);
  auto ds = ddp::make(g, strict.parameters(), small_buckets());
  if (!ds) return "make: " + ds.error().to_string();
  // Buckets are {p3}, {p2, p1}, {p0}: leaving p0 out keeps the launched ones matched.
  for (std::size_t k : {3u, 2u, 1u}) (void)(*ds)->mark_ready(k);
  auto r = (*ds)->finish_step();
  if (r || r.error().message().find("'p0'") == std::string::npos)
    return "an unmarked parameter was not refused by name";
  return {};
}

/// barrier, broadcast of objects, reduce (sum and mean), and refused parameter lists.
inline std::string ddp_strategy_collectives(std::shared_ptr<process_group> g) {
  loose_model m(0);
  auto d = ddp::make(g, m.parameters(), small_buckets());
  if (!d) return "make: " + d.error().to_string();
  if (auto b = (*d)->barrier(); !b) return b.error().to_string();
  int src = g->size() - 1;
  auto s = (*d)->broadcast_object(std::string("from rank ") + std::to_string(g->rank()), src);
  if (!s || *s != "from rank " + std::to_string(src)) return "broadcast of a string failed";
  auto v = (*d)->broadcast_object(std::vector<double>{1.5, static_cast<double>(g->rank())}, 0);
  if (!v || *v != std::vector<double>{1.5, 0}) return "broadcast of a vector failed";
  auto e = (*d)->broadcast_object(std::vector<std::string>{}, 0);
  if (!e || !e->empty()) return "broadcast of an empty vector failed";
  if ((*d)->broadcast_bytes({}, g->size())) return "a source outside the group was accepted";
  double x[2] = {static_cast<double>(g->rank()), 1};
  if (auto r = (*d)->reduce({x, dtype::float64, 2, device::cpu()}, collectives::reduce_op::sum); !r)
    return r.error().to_string();
  double n = g->size();
  if (x[0] != n * (n - 1) / 2 || x[1] != n) return "reduce sum is wrong";
  double y = g->rank();
  if (auto r = (*d)->reduce({&y, dtype::float64, 1, device::cpu()}); !r)
    return r.error().to_string();
  if (y != (n - 1) / 2) return "reduce mean is wrong";
  if ((*d)->reduce({&y, dtype::float64, 1, device::cpu()}, collectives::reduce_op::max))
    return "reduce max was accepted";
  if (g->size() > 1) {
    // Rank 0 has one parameter less: refused on every rank.
    loose_model odd(0);
    auto ps = odd.parameters();
    if (g->rank() == 0) ps.pop_back();
    auto refused = ddp::make(g, ps, small_buckets());
    if (refused || refused.error().message().find("same parameter list") == std::string::npos)
      return "a different parameter list was not refused";
  }
  return {};
}

}  // namespace troupe::training::testing
