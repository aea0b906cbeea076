#include <troupe/training/elastic_loop.hpp>

#include <cstring>
#include <limits>

#include <troupe/core/log.hpp>

namespace troupe::training {

namespace {

using collectives::reduce_op;

constexpr auto none = std::numeric_limits<std::int64_t>::max();
// Waits on the loop's own work allow this much beyond the work's timeout, so that the
// work's own timeout (which names the group and the ranks) fires first.
constexpr auto wait_grace = std::chrono::seconds(5);

bool changed(const troupe::error& e) { return e.code() == errc::membership_changed; }

std::string where(const elastic_step& s) {
  return strcat("step ", s.step, " (epoch ", s.epoch, ", rank ", s.rank, " of ", s.world, ")");
}

// Waits for every work (so none outlives its buffers) and returns the first failure.
expected<void> wait_all(std::vector<collectives::work>& works, duration timeout) {
  expected<void> first = ok();
  for (auto& w : works) {
    auto r = w.wait(timeout + wait_grace);
    if (!r && first) first = std::move(r);
  }
  return first;
}

}  // namespace

std::pair<std::int64_t, std::int64_t> split_evenly(std::int64_t items, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world || items <= 0) return {0, 0};
  const std::int64_t base = items / world, extra = items % world;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

expected<std::unique_ptr<elastic_loop>> elastic_loop::make(collectives::elastic_group& group,
                                                           std::vector<parameter> params,
                                                           std::vector<tensor_view> optimizer_state,
                                                           elastic_loop_options options) {
  if (params.empty())
    return make_error(errc::invalid_argument, "elastic_loop: no parameters to train");
  TROUPE_TRY(check_parameters(params));
  for (const auto& p : params)
    if (!p.value.where.is_cpu())
      return make_error(errc::invalid_argument, "elastic_loop: parameter '", p.name, "' lives on ",
                        p.value.where.to_string(), "; the elastic loop trains CPU tensors");
  for (std::size_t i = 0; i < optimizer_state.size(); ++i) {
    const auto& t = optimizer_state[i];
    if (!t.where.is_cpu() || (t.data == nullptr && t.numel > 0))
      return make_error(errc::invalid_argument, "elastic_loop: optimizer state tensor ", i,
                        " must be a CPU tensor with data (it is ", t.where.to_string(),
                        t.data == nullptr ? ", null" : "", ")");
  }
  if (options.steps < 1)
    return make_error(errc::invalid_argument, "elastic_loop: steps must be at least 1, got ",
                      options.steps);
  if (options.timeout <= duration::zero() || options.rebuild_timeout <= duration::zero())
    return make_error(errc::invalid_argument,
                      "elastic_loop: the timeout and the rebuild timeout must be positive");
  std::unique_ptr<elastic_loop> l(new elastic_loop());
  l->group_ = &group;
  for (const auto& p : params) l->state_.push_back(p.value);
  for (const auto& t : optimizer_state) l->state_.push_back(t);
  l->params_ = std::move(params);
  l->options_ = std::move(options);
  for (const auto& t : l->state_) l->copy_.emplace_back(t.nbytes());
  return l;
}

void elastic_loop::keep_copy() {
  for (std::size_t i = 0; i < state_.size(); ++i)
    if (state_[i].nbytes() > 0) std::memcpy(copy_[i].data(), state_[i].data, state_[i].nbytes());
}

void elastic_loop::restore_copy() {
  for (std::size_t i = 0; i < state_.size(); ++i)
    if (state_[i].nbytes() > 0) std::memcpy(state_[i].data, copy_[i].data(), state_[i].nbytes());
}

expected<void> elastic_loop::agree_and_broadcast(collectives::process_group& g,
                                                 std::uint64_t epoch) {
  // The step to run: the smallest among the members with state (a member one step ahead
  // applied a step that another discarded); the source: the lowest rank with state.
  std::int64_t v[2] = {has_state_ ? step_ : none, has_state_ ? g.rank() : none};
  TROUPE_TRY(g.allreduce(tensor_view{v, dtype::int64, 2, device::cpu()},
                         {reduce_op::min, options_.timeout})
                 .wait(options_.timeout + wait_grace));
  const std::int64_t agreed = v[0] == none ? 0 : v[0];
  const int source = v[1] == none ? 0 : static_cast<int>(v[1]);
  if (has_state_ && step_ == agreed + 1) {
    restore_copy();  // the step in flight was applied here but not everywhere
    step_ = agreed;
    ++discarded_;
  } else if (has_state_ && step_ != agreed) {
    return make_error(errc::internal, "elastic_loop: this member finished ", step_,
                      " steps but the members agreed on ", agreed,
                      "; members can differ by one step at most");
  }
  std::vector<collectives::work> works;
  for (auto& t : state_)
    if (t.numel > 0) works.push_back(g.broadcast(t, {source, options_.timeout}));
  TROUPE_TRY(wait_all(works, options_.timeout));
  step_ = agreed;
  has_state_ = true;
  at_ = elastic_step{step_, g.rank(), g.size(), epoch};
  return ok();
}

expected<void> elastic_loop::resync() {
  for (;;) {
    auto v = group_->rebuild(options_.rebuild_timeout);
    if (!v)
      return make_error(v.error().code(), "elastic_loop: rebuilding the group after step ", step_,
                        " failed: ", v.error().message());
    if (v->group != current_) ++groups_;
    current_ = v->group;
    auto r = agree_and_broadcast(*current_, v->epoch.number);
    if (!r && changed(r.error())) continue;  // the epoch moved again: rebuild for it
    if (!r)
      return make_error(r.error().code(), "elastic_loop: exchanging the state in epoch ",
                        v->epoch.number, " failed: ", r.error().message());
    TROUPE_LOG(log_level::info, "training", "elastic_loop: step ", step_, " on ",
               collectives::describe(*current_), " (epoch ", v->epoch.number, ": ",
               v->epoch.names(), ")");
    if (options_.on_resize) options_.on_resize(at_, v->epoch);
    return ok();
  }
}

expected<void> elastic_loop::run(const step_fn& compute, const step_fn& apply) {
  if (!compute || !apply)
    return make_error(errc::invalid_argument, "elastic_loop::run needs a compute and an apply");
  bool resync_due = true;
  for (;;) {
    if (resync_due) {
      TROUPE_TRY(resync());
      resync_due = false;
    }
    auto& g = *current_;
    if (step_ >= options_.steps) {
      // Every member confirms it is done; one whose last step failed makes this fail too.
      std::int64_t done = step_;
      auto r = g.allreduce(tensor_view{&done, dtype::int64, 1, device::cpu()},
                           {reduce_op::min, options_.timeout})
                   .wait(options_.timeout + wait_grace);
      if (r && done >= options_.steps) return ok();
      if (r)
        return make_error(errc::internal, "elastic_loop: a member of ", collectives::describe(g),
                          " confirmed only ", done, " of ", options_.steps, " steps");
      if (!changed(r.error())) return std::move(r).error();
      resync_due = true;
      continue;
    }
    at_.step = step_;
    if (auto c = compute(at_); !c)
      return make_error(c.error().code(), "elastic_loop: compute of ", where(at_),
                        " failed: ", c.error().message());
    std::vector<collectives::work> works;
    for (auto& p : params_)
      if (p.grad.numel > 0)
        works.push_back(g.allreduce(p.grad, {reduce_op::avg, options_.timeout}));
    if (auto r = wait_all(works, options_.timeout); !r) {
      if (!changed(r.error()))
        return make_error(r.error().code(), "elastic_loop: averaging the gradients of ", where(at_),
                          " failed: ", r.error().message());
      ++discarded_;  // nothing was applied: the parameters are as before the step
      resync_due = true;
      continue;
    }
    // The state before the step, kept until the next one is applied: a member that applied
    // it while another gave it up rolls back to this (agree_and_broadcast).
    keep_copy();
    if (auto a = apply(at_); !a)
      return make_error(a.error().code(), "elastic_loop: apply of ", where(at_),
                        " failed: ", a.error().message());
    ++step_;
  }
}

}  // namespace troupe::training
