#include <troupe/training/ddp.hpp>

#include <troupe/core/trace.hpp>

#include <algorithm>
#include <map>

namespace troupe::training {

using collectives::join;

expected<std::unique_ptr<ddp>> ddp::make(std::shared_ptr<collectives::process_group> group,
                                         std::vector<parameter> params, ddp_options options) {
  if (!group) return make_error(errc::invalid_argument, "ddp needs a process group");
  TROUPE_TRY(check_parameters(params));
  if (options.averaging && (options.averaging->period < 1 || options.averaging->warmup_steps < 0))
    return make_error(errc::invalid_argument,
                      "model averaging needs period >= 1 and "
                      "warmup_steps >= 0 (got period ",
                      options.averaging->period, ", warmup_steps ", options.averaging->warmup_steps,
                      ")");
  if (!options.hook) options.hook = allreduce_hook();
  std::unique_ptr<ddp> d(new ddp());
  d->group_ = std::move(group);
  d->params_ = std::move(params);
  d->options_ = std::move(options);
  if (!d->params_.empty()) d->device_ = d->params_.front().grad.where;
  auto plans =
      plan_buckets(d->params_, d->options_.first_bucket_cap_bytes, d->options_.bucket_cap_bytes);
  if (!plans) return std::move(plans).error();
  d->plans_ = std::move(*plans);
  d->bucket_of_.resize(d->params_.size());
  for (std::size_t b = 0; b < d->plans_.size(); ++b) {
    std::vector<tensor_view> grads;
    for (auto i : d->plans_[b].params) {
      grads.push_back(d->params_[i].grad);
      d->bucket_of_[i] = b;
    }
    auto flat = flat_views::make(std::move(grads));
    if (!flat) return std::move(flat).error();
    d->buckets_.push_back({std::move(*flat), 0, {}});
  }
  std::map<std::pair<dtype, device>, std::vector<tensor_view>> by_kind;
  for (auto& p : d->params_) by_kind[{p.value.type, p.value.where}].push_back(p.value);
  for (auto& [kind, views] : by_kind) {
    auto flat = flat_views::make(std::move(views));
    if (!flat) return std::move(flat).error();
    d->values_.push_back(std::move(*flat));
  }
  d->ready_.assign(d->params_.size(), 0);
  if (d->group_->size() > 1) {
    TROUPE_TRY(d->check_across_ranks());
    if (d->options_.broadcast_parameters) TROUPE_TRY(d->broadcast_values(0));
  }
  return d;
}

ddp::~ddp() {
  for (auto& b : buckets_)
    if (b.result.valid()) (void)b.result.wait_for(options_.timeout + wait_grace);
}

bool ddp::averaging_due() const {
  if (!options_.averaging) return false;
  const auto& a = *options_.averaging;
  return steps_ >= a.warmup_steps && (steps_ - a.warmup_steps) % a.period == 0;
}

expected<void> ddp::begin_step() {
  if (in_step_) return ok();
  if (average_pending_)
    return make_error(errc::invalid_argument, "ddp: step ", steps_,
                      " is due for parameter averaging; call after_optimizer_step() after "
                      "each optimizer step, before the next step begins");
  const bool sync = no_sync_depth_ == 0;
  const bool local_sgd = options_.averaging && steps_ >= options_.averaging->warmup_steps;
  step_flags mine{1, sync && !local_sgd ? 1 : 0, sync && averaging_due() ? 1 : 0};
  step_flags all{world_size(), mine.grad_sync, mine.average};
  auto notified = join::notify_join_context(*this);
  if (!notified) return std::move(notified).error();
  if (join_config().enable) {
    auto f = exchange_flags(mine);
    if (!f) return std::move(f).error();
    all = *f;
  }
  step_counts_ = sync;
  step_syncs_ = mine.grad_sync != 0;
  step_averages_ = mine.average != 0;
  grad_divisor_ =
      join_config().enable && !divide_by_initial_world_size_ ? all.active : world_size();
  avg_divisor_ = all.active;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].pending = plans_[b].params.size();
  next_launch_ = 0;
  in_step_ = true;
  step_started_ns_ = trace::enabled() ? trace::now_ns() : 0;
  return ok();
}

void ddp::launch(std::size_t b) {
  auto& s = buckets_[b];
  s.flat.pack();
  s.launched_ns = trace::enabled() ? trace::now_ns() : 0;
  comm_bucket cb{b, s.flat.view(), grad_divisor_, group_.get(), options_.timeout};
  try {
    s.result = options_.hook(cb);
    if (!s.result.valid())
      s.result = make_error_future<void>(make_error(
          errc::invalid_argument, "the comm hook returned an empty future for bucket ", b));
  } catch (...) {
    s.result =
        make_error_future<void>(make_error(errc::user_error, "the comm hook threw for bucket ", b));
  }
}

expected<void> ddp::mark_ready(std::size_t index) {
  TROUPE_TRY(begin_step());
  if (index >= params_.size())
    return make_error(errc::invalid_argument, "ddp.mark_ready: parameter ", index,
                      " does not exist (", params_.size(), " parameters)");
  if (ready_[index])
    return make_error(errc::invalid_argument, "ddp.mark_ready: parameter ", index, " ('",
                      params_[index].name, "') was marked ready twice in one step");
  ready_[index] = 1;
  if (!step_syncs_) return ok();
  --buckets_[bucket_of_[index]].pending;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(next_launch_++);
  return ok();
}

expected<void> ddp::wait_buckets() {
  expected<void> first;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& s = buckets_[b];
    if (!s.result.valid()) continue;
    auto r = s.result.get(options_.timeout + wait_grace);
    if (s.launched_ns != 0) {
      // From the hook's start to the moment this rank had the result: the bucket's
      // communication as the step saw it (it may have ended earlier, behind other buckets).
      trace::complete("ddp", "bucket", s.launched_ns, trace::now_ns(),
                      trace::args()
                          .add("bucket", static_cast<std::uint64_t>(b))
                          .add("bytes", static_cast<std::uint64_t>(s.flat.view().nbytes()))
                          .add("params", static_cast<std::uint64_t>(plans_[b].params.size()))
                          .add("step", static_cast<std::uint64_t>(steps_))
                          .add("ok", r ? "yes" : "no"));
      s.launched_ns = 0;
    }
    if (r && first) s.flat.unpack();
    if (!r && first) first = std::move(r).error().with_operation("ddp.finish_step");
  }
  return first;
}

expected<void> ddp::finish_step() {
  TROUPE_TRY(begin_step());
  expected<void> result;
  if (step_syncs_) {
    std::vector<std::size_t> unused;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) unused.push_back(i);
    if (!unused.empty() && !options_.find_unused_parameters) {
      std::string names;
      for (std::size_t k = 0; k < unused.size() && k < 5; ++k)
        names += (k ? ", '" : "'") + params_[unused[k]].name + "'";
      if (unused.size() > 5) names += strcat(" and ", unused.size() - 5, " more");
      result = make_error(errc::invalid_argument, "ddp.finish_step: ", unused.size(),
                          " parameters got no gradient this step (", names,
                          "); mark every parameter ready, or set find_unused_parameters "
                          "(the other ranks' step cannot complete without them)");
    } else {
      for (auto i : unused) {
        fill_zero(params_[i].grad);
        if (auto r = mark_ready(i); !r) return r;
      }
    }
    auto waited = wait_buckets();
    if (result && !waited) result = std::move(waited);
  }
  in_step_ = false;
  if (step_started_ns_ != 0) {
    trace::complete("ddp", "step", step_started_ns_, trace::now_ns(),
                    trace::args()
                        .add("step", static_cast<std::uint64_t>(steps_))
                        .add("buckets", static_cast<std::uint64_t>(buckets_.size()))
                        .add("synced", step_syncs_ ? "yes" : "no")
                        .add("ok", result ? "yes" : "no"));
    step_started_ns_ = 0;
  }
  if (!result) return result;
  if (step_counts_) {
    if (step_averages_) average_pending_ = true;
    ++steps_;
  }
  return ok();
}

expected<void> ddp::sync_gradients() {
  TROUPE_TRY(begin_step());
  for (std::size_t i = params_.size(); i-- > 0;)
    if (!ready_[i]) TROUPE_TRY(mark_ready(i));
  return finish_step();
}

expected<bool> ddp::after_optimizer_step() {
  if (!average_pending_) return false;
  average_pending_ = false;
  TROUPE_TRY(average_values(avg_divisor_));
  ++averagings_;
  return true;
}

}  // namespace troupe::training
