// Join scenarios run by every rank of a group, as threads (join_test.cpp) or as
// processes (join_test_worker.cpp). Each returns "" on success, else what went wrong.
#pragma once

#include <string>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/join.hpp>
#include <troupe/core/log.hpp>

namespace troupe::collectives::testing {

using namespace std::chrono_literals;

/// A joinable that all-reduces a 1 `per_step` times per step; its main hook shadows with
/// zeros. Every result is the number of ranks not yet joined.
class all_reducer final : public joinable {
 public:
  explicit all_reducer(process_group& g) : g_(g) {}

  /// One step; appends each all-reduce's result to `seen`.
  expected<void> step() {
    auto w = join::notify_join_context(*this);
    if (!w) return std::move(w).error();
    notified_ += w->has_value() ? 1 : 0;
    for (std::int64_t k = 0; k < per_step_; ++k) {
      std::int32_t one = 1;
      auto r =
          g_.allreduce({&one, dtype::int32, 1, device::cpu()}, {reduce_op::sum, 10s}).wait(15s);
      if (!r) return r;
      seen.push_back(one);
    }
    if (*w) TROUPE_TRY((*w)->wait(15s));
    return ok();
  }

  expected<std::unique_ptr<::troupe::collectives::join_hook>> join_hook(
      const join_args& args) override {
    auto n = args.get<std::int64_t>("per_step", 1);
    if (!n) return std::move(n).error();
    per_step_ = *n;
    return std::unique_ptr<::troupe::collectives::join_hook>(new hook(*this));
  }
  device join_device() const override { return device::cpu(); }
  process_group& join_process_group() const override { return g_; }

  std::vector<std::int32_t> seen;
  int main_hooks = 0;
  int post_hooks = 0;
  bool last_joiner = false;
  int notified_ = 0;
  std::int64_t per_step_ = 1;

 private:
  struct hook final : ::troupe::collectives::join_hook {
    explicit hook(all_reducer& a) : a_(a) {}
    expected<void> main_hook() override {
      ++a_.main_hooks;
      for (std::int64_t k = 0; k < a_.per_step_; ++k) {
        std::int32_t zero = 0;
        auto r = a_.g_.allreduce({&zero, dtype::int32, 1, device::cpu()}, {reduce_op::sum, 10s})
                     .wait(15s);
        if (!r) return r;
      }
      return ok();
    }
    expected<void> post_hook(bool is_last_joiner) override {
      ++a_.post_hooks;
      a_.last_joiner = is_last_joiner;
      return ok();
    }
    all_reducer& a_;
  };
  process_group& g_;
};

/// Inputs per rank: uneven, with the maximum held by ranks 1 and 2 (when present).
inline std::vector<int> uneven_inputs(int world) {
  std::vector<int> all{4, 7, 7, 5};
  return {all.begin(), all.begin() + world};
}

/// Uneven inputs under an enabled scope with two joinables and per_step = 2 forwarded to
/// both: every result counts the ranks still training, main hooks run max - mine times,
/// is_last_joiner holds on the ranks with the most inputs, and only the first joinable
/// notifies.
inline std::string join_uneven(process_group& g) {
  auto inputs = uneven_inputs(g.size());
  int mine = inputs[static_cast<std::size_t>(g.rank())];
  int most = *std::max_element(inputs.begin(), inputs.end());
  all_reducer a(g), b(g);
  join_options o;
  o.args = {{"per_step", std::int64_t{2}}};
  o.timeout = 10s;
  auto j = join::make({&a, &b}, o);
  if (!j) return "make: " + j.error().to_string();
  auto r = j->run([&]() -> expected<void> {
    for (int i = 0; i < mine; ++i) {
      TROUPE_TRY(a.step());
      TROUPE_TRY(b.step());
    }
    return ok();
  });
  if (!r) return "run: " + r.error().to_string();
  if (a.per_step_ != 2 || b.per_step_ != 2) return "the hook argument did not reach both";
  std::vector<std::int32_t> want;
  for (int i = 0; i < mine; ++i) {
    int active = 0;
    for (int n : inputs) active += n > i ? 1 : 0;
    want.insert(want.end(), 2, active);
  }
  if (a.seen != want || b.seen != want) return "an all-reduce did not count the active ranks";
  if (a.notified_ != mine || b.notified_ != 0) return "not only the first joinable notified";
  if (a.main_hooks != most - mine || b.main_hooks != most - mine)
    return strcat("main hooks ran ", a.main_hooks, "/", b.main_hooks, " times, not ", most - mine);
  if (j->shadowed_iterations() != most - mine) return "shadowed_iterations is wrong";
  if (a.post_hooks != 1 || b.post_hooks != 1) return "post hooks did not run once";
  if (a.last_joiner != (mine == most) || b.last_joiner != (mine == most))
    return strcat("is_last_joiner is ", a.last_joiner, " with ", mine, " of ", most, " inputs");
  if (a.join_config().enable) return "the config stayed enabled after the scope";
  return {};
}

/// throw_on_early_termination: every rank's run ends with errc::aborted from "join".
inline std::string join_throws(process_group& g) {
  auto inputs = uneven_inputs(g.size());
  int mine = inputs[static_cast<std::size_t>(g.rank())];
  int fewest = *std::min_element(inputs.begin(), inputs.end());
  all_reducer a(g);
  join_options o;
  o.throw_on_early_termination = true;
  o.timeout = 10s;
  auto j = join::make({&a}, o);
  if (!j) return "make: " + j.error().to_string();
  auto r = j->run([&]() -> expected<void> {
    for (int i = 0; i < mine; ++i) TROUPE_TRY(a.step());
    return ok();
  });
  if (r) return "the run succeeded instead of stopping";
  if (r.error().code() != errc::aborted || r.error().operation() != "join")
    return "wrong error: " + r.error().to_string();
  bool first = mine == fewest;
  auto& m = r.error().message();
  if (first != (m.find("ran out of inputs first") != std::string::npos))
    return "the message does not say who ran out: " + m;
  // Ranks still training stopped in the step after the first rank's last one.
  if (!first && a.seen.size() != static_cast<std::size_t>(fewest))
    return strcat("a training rank ran ", a.seen.size(), " steps, not ", fewest);
  if (a.main_hooks != 0) return "main hooks ran in throw mode";
  return {};
}

/// enable = false: no notification, no hooks, results as without any scope.
inline std::string join_disabled(process_group& g) {
  all_reducer a(g);
  join_options o;
  o.enable = false;
  auto j = join::make({&a}, o);
  if (!j) return "make: " + j.error().to_string();
  auto r = j->run([&]() -> expected<void> {
    for (int i = 0; i < 3; ++i) TROUPE_TRY(a.step());
    return ok();
  });
  if (!r) return "run: " + r.error().to_string();
  if (a.notified_ != 0 || a.main_hooks != 0 || a.post_hooks != 0)
    return "a disabled scope notified or ran hooks";
  if (a.seen != std::vector<std::int32_t>(3, g.size())) return "results differ from no Join";
  // The same steps with no scope at all give the same results.
  all_reducer plain(g);
  for (int i = 0; i < 3; ++i)
    if (auto s = plain.step(); !s) return "plain step: " + s.error().to_string();
  if (plain.seen != a.seen) return "a disabled scope changed the results";
  return {};
}

/// Joinables on different process groups are refused on every rank.
inline std::string join_refuses_groups(process_group& g) {
  std::vector<int> all;
  for (int r = 0; r < g.size(); ++r) all.push_back(r);
  auto sub = new_group(g, all, {"", 10s});
  if (!sub || !*sub) return "new_group failed";
  all_reducer a(g), b(**sub);
  auto j = join::make({&a, &b});
  if (j) return "joinables on two groups were accepted";
  if (j.error().code() != errc::invalid_argument ||
      j.error().message().find("same process group") == std::string::npos)
    return "wrong refusal: " + j.error().to_string();
  if (a.join_config().enable || b.join_config().enable) return "a refused scope enabled a joinable";
  auto empty = join::make({});
  if (empty || empty.error().code() != errc::invalid_argument) return "an empty list was accepted";
  return {};
}

/// A rank that shadows more than 1000 iterations warns once.
inline std::string join_shadows_a_long_skew(process_group& g) {
  int mine = g.rank() == 0 ? 0 : 1002;
  all_reducer a(g);
  join_options o;
  o.timeout = 10s;
  auto j = join::make({&a}, o);
  if (!j) return "make: " + j.error().to_string();
  auto r = j->run([&]() -> expected<void> {
    for (int i = 0; i < mine; ++i) TROUPE_TRY(a.step());
    return ok();
  });
  if (!r) return "run: " + r.error().to_string();
  if (g.rank() == 0 && a.main_hooks != 1002) return "rank 0 shadowed the wrong count";
  return {};
}

}  // namespace troupe::collectives::testing
