// A small multilayer perceptron with hand-written forward and backward passes, synthetic
// data, and the sharding used by the training demo (and by the training tests):
//   logits = W2 * relu(W1 * x + b1) + b2, softmax cross-entropy, mean over the batch.
// Weights and gradients live in one flat buffer each, so the parameters are views into
// them (and DDP all-reduces the gradients in place).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <troupe/training/parameter.hpp>

namespace troupe::examples {

/// A deterministic generator (splitmix64) so every process builds the same data.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1).
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 23) - 1.f; }
};

struct dataset {
  int features = 0, classes = 0;
  std::vector<float> x;  // samples * features
  std::vector<int> y;
  int size() const { return static_cast<int>(y.size()); }
};

/// `n` samples labelled by a fixed random teacher (argmax of a linear map plus noise).
inline dataset make_dataset(int n, int features, int classes, std::uint64_t seed) {
  rng r{seed};
  std::vector<float> teacher(static_cast<std::size_t>(features * classes));
  for (auto& t : teacher) t = r.uniform();
  dataset d{features, classes, {}, {}};
  d.x.resize(static_cast<std::size_t>(n * features));
  for (auto& v : d.x) v = r.uniform();
  for (int i = 0; i < n; ++i) {
    int best = 0;
    float best_v = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float v = 0.1f * r.uniform();
      for (int f = 0; f < features; ++f)
        v += teacher[static_cast<std::size_t>(c * features + f)] *
             d.x[static_cast<std::size_t>(i * features + f)];
      if (v > best_v) best_v = v, best = c;
    }
    d.y.push_back(best);
  }
  return d;
}

/// Rank r's shard: a contiguous range whose size falls with the rank (uneven on purpose):
/// weights world+1, world, ..., 2 of the total.
inline std::pair<int, int> shard(int samples, int rank, int world) {
  double total = 0, before = 0;
  for (int r = 0; r < world; ++r) total += world + 1 - r;
  for (int r = 0; r < rank; ++r) before += world + 1 - r;
  int begin = static_cast<int>(samples * before / total);
  int end = static_cast<int>(samples * (before + world + 1 - rank) / total);
  return {begin, end};
}

class mlp {
 public:
  mlp(int in, int hidden, int out, std::uint64_t seed) : in_(in), hidden_(hidden), out_(out) {
    sizes_ = {static_cast<std::size_t>(hidden * in), static_cast<std::size_t>(hidden),
              static_cast<std::size_t>(out * hidden), static_cast<std::size_t>(out)};
    std::size_t total = 0;
    for (auto s : sizes_) offsets_.push_back(total), total += s;
    w.resize(total);
    g.assign(total, 0.f);
    rng r{seed};
    float s1 = std::sqrt(2.f / static_cast<float>(in)),
          s2 = std::sqrt(1.f / static_cast<float>(hidden));
    for (std::size_t i = 0; i < sizes_[0]; ++i) w[i] = s1 * r.uniform();
    for (std::size_t i = 0; i < sizes_[2]; ++i) w[offsets_[2] + i] = s2 * r.uniform();
  }

  /// The four parameters (W1, b1, W2, b2) as views into w and g.
  std::vector<training::parameter> parameters() {
    const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    std::vector<training::parameter> ps;
    for (std::size_t k = 0; k < 4; ++k)
      ps.push_back({names[k], tensor_view::of(std::span(w).subspan(offsets_[k], sizes_[k])),
                    tensor_view::of(std::span(g).subspan(offsets_[k], sizes_[k]))});
    return ps;
  }

  /// Forward and backward on samples [begin, end) of `d`: adds the gradient of the mean
  /// loss to g and returns the mean loss. `ready(k)` is called as parameter k's gradient
  /// becomes final (fc2 first, as a backward pass goes).
  float train_batch(const dataset& d, int begin, int end,
                    const std::function<void(std::size_t)>& ready = {}) {
    int n = end - begin;
    std::vector<float> h(static_cast<std::size_t>(n * hidden_)),
        dlogits(static_cast<std::size_t>(n * out_));
    float loss = 0;
    for (int i = 0; i < n; ++i) {
      const float* x = &d.x[static_cast<std::size_t>((begin + i) * in_)];
      float* hi = &h[static_cast<std::size_t>(i * hidden_)];
      for (int j = 0; j < hidden_; ++j) {
        float v = w[offsets_[1] + static_cast<std::size_t>(j)];
        for (int f = 0; f < in_; ++f) v += w1(j, f) * x[f];
        hi[j] = std::max(v, 0.f);
      }
      float* dl = &dlogits[static_cast<std::size_t>(i * out_)];
      float mx = -1e30f;
      for (int c = 0; c < out_; ++c) {
        float v = w[offsets_[3] + static_cast<std::size_t>(c)];
        for (int j = 0; j < hidden_; ++j) v += w2(c, j) * hi[j];
        dl[c] = v;
        mx = std::max(mx, v);
      }
      float sum = 0;
      for (int c = 0; c < out_; ++c) sum += (dl[c] = std::exp(dl[c] - mx));
      int label = d.y[static_cast<std::size_t>(begin + i)];
      loss += -std::log(dl[label] / sum);
      for (int c = 0; c < out_; ++c)
        dl[c] = (dl[c] / sum - (c == label ? 1.f : 0.f)) / static_cast<float>(n);
    }
    // fc2: dW2 = dlogits^T h, db2 = sum dlogits
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < out_; ++c) {
        float dl = dlogits[static_cast<std::size_t>(i * out_ + c)];
        g[offsets_[3] + static_cast<std::size_t>(c)] += dl;
        for (int j = 0; j < hidden_; ++j)
          gw2(c, j) += dl * h[static_cast<std::size_t>(i * hidden_ + j)];
      }
    if (ready) ready(3), ready(2);
    // fc1: dh = W2^T dlogits masked by relu; dW1 = dh^T x, db1 = sum dh
    for (int i = 0; i < n; ++i) {
      const float* x = &d.x[static_cast<std::size_t>((begin + i) * in_)];
      for (int j = 0; j < hidden_; ++j) {
        if (h[static_cast<std::size_t>(i * hidden_ + j)] <= 0) continue;
        float dh = 0;
        for (int c = 0; c < out_; ++c)
          dh += w2(c, j) * dlogits[static_cast<std::size_t>(i * out_ + c)];
        g[offsets_[1] + static_cast<std::size_t>(j)] += dh;
        for (int f = 0; f < in_; ++f) gw1(j, f) += dh * x[f];
      }
    }
    if (ready) ready(1), ready(0);
    return loss / static_cast<float>(n);
  }

  void zero_grad() { std::fill(g.begin(), g.end(), 0.f); }
  void sgd(float lr) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
  }

  std::vector<float> w, g;

 private:
  float w1(int j, int f) const { return w[static_cast<std::size_t>(j * in_ + f)]; }
  float w2(int c, int j) const {
    return w[offsets_[2] + static_cast<std::size_t>(c * hidden_ + j)];
  }
  float& gw1(int j, int f) { return g[static_cast<std::size_t>(j * in_ + f)]; }
  float& gw2(int c, int j) { return g[offsets_[2] + static_cast<std::size_t>(c * hidden_ + j)]; }

  int in_, hidden_, out_;
  std::vector<std::size_t> sizes_, offsets_;
};

/// Adds rank `r`'s contribution `g` to `sum` as the group's reduction does: rank 0's
/// replaces it, every later one is added in rank order (((g0 + g1) + g2) + ...).
inline void fold_in_rank_order(std::vector<float>& sum, const std::vector<float>& g, int r) {
  if (r == 0) {
    sum = g;
    return;
  }
  for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = sum[k] + g[k];
}

/// What data-parallel training with these shards computes, in one process, in the same
/// order of float operations as the group: at step i every rank computes the gradient of
/// its batch i on its own (zeros when it has no batch i left: Join's shadow contribution),
/// the contributions are summed in rank order (((g0 + g1) + g2) + ..., the fold every gloo
/// algorithm uses, so every member gets bit-identical results), the sum is divided by the
/// world size (DDP's average with Join's default, divide_by_initial_world_size), then one
/// SGD step. Float addition is not associative, so summing in any other order (e.g. every
/// batch into one buffer) drifts by a few ulps per step and the drift grows with the
/// epochs; in this order the result is the group's, bit for bit.
inline std::vector<float> reference_training(const dataset& d, int world, int epochs, int batch,
                                             float lr, std::uint64_t seed, int in, int hidden,
                                             int out) {
  mlp m(in, hidden, out, seed);
  std::vector<std::pair<int, int>> shards;
  int most = 0;
  for (int r = 0; r < world; ++r) {
    shards.push_back(shard(d.size(), r, world));
    most = std::max(most, (shards.back().second - shards.back().first + batch - 1) / batch);
  }
  std::vector<float> sum(m.g.size());
  for (int e = 0; e < epochs; ++e)
    for (int i = 0; i < most; ++i) {
      for (int r = 0; r < world; ++r) {
        auto [b, en] = shards[static_cast<std::size_t>(r)];
        int begin = b + i * batch;
        m.zero_grad();
        if (begin < en) m.train_batch(d, begin, std::min(en, begin + batch));
        fold_in_rank_order(sum, m.g, r);
      }
      for (std::size_t k = 0; k < sum.size(); ++k) m.g[k] = sum[k] / static_cast<float>(world);
      m.sgd(lr);
    }
  return m.w;
}

}  // namespace troupe::examples
