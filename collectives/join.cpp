#include <troupe/collectives/join.hpp>

#include <troupe/core/log.hpp>
#include <troupe/core/trace.hpp>

namespace troupe::collectives {

namespace {

constexpr std::int64_t warn_threshold = 1000;

troupe::error join_error(errc code, std::string message) {
  return std::move(troupe::error(code, std::move(message))).with_operation("join");
}

}  // namespace

joinable::~joinable() {
  for (auto& [w, buf] : in_flight_) (void)w.wait(config_.timeout);
}

std::vector<std::string> join_args::keys() const {
  std::vector<std::string> out;
  for (auto& [k, v] : values_) out.push_back(k);
  return out;
}

expected<join> join::make(std::vector<joinable*> joinables, join_options options) {
  if (joinables.empty())
    return join_error(errc::invalid_argument,
                      "a join scope needs at least one joinable; pass the objects whose "
                      "collectives must be shadowed (e.g. the DDP strategy)");
  process_group* group = nullptr;
  for (std::size_t i = 0; i < joinables.size(); ++i) {
    auto* j = joinables[i];
    if (!j) return join_error(errc::invalid_argument, strcat("joinable ", i, " is null"));
    if (j->in_scope_)
      return join_error(
          errc::invalid_argument,
          strcat("joinable ", i, " is already in another join scope; end that scope first"));
    process_group* g = &j->join_process_group();
    if (!group) {
      group = g;
    } else if (g != group) {
      return join_error(
          errc::invalid_argument,
          strcat("joinable ", i, " runs on ", describe(*g), " but joinable 0 on ", describe(*group),
                 "; a join scope needs every joinable on the same process group"));
    }
  }
  join j;
  j.group_ = group;
  j.device_ = joinables.front()->join_device();
  j.options_ = std::move(options);
  for (std::size_t i = 0; i < joinables.size(); ++i) {
    auto hook = joinables[i]->join_hook(j.options_.args);
    if (!hook) return std::move(hook).error().with_operation("join");
    if (!*hook)
      return join_error(errc::invalid_argument, strcat("joinable ", i, " gave a null join hook"));
    j.hooks_.push_back(std::move(*hook));
  }
  j.joinables_ = std::move(joinables);
  for (std::size_t i = 0; i < j.joinables_.size(); ++i) {
    auto* p = j.joinables_[i];
    p->in_scope_ = true;
    p->config_ = {j.options_.enable, j.options_.throw_on_early_termination, i == 0,
                  j.options_.timeout};
  }
  j.open_ = true;
  return j;
}

join::join(join&& other) noexcept
    : joinables_(std::move(other.joinables_)),
      hooks_(std::move(other.hooks_)),
      in_flight_(std::move(other.in_flight_)),
      group_(other.group_),
      device_(other.device_),
      options_(std::move(other.options_)),
      shadowed_(other.shadowed_),
      open_(other.open_) {
  other.open_ = false;
  other.joinables_.clear();
}

join::~join() { close(); }

void join::close() noexcept {
  if (!open_) return;
  open_ = false;
  for (auto* p : joinables_) {
    p->config_ = {};
    p->in_scope_ = false;
  }
}

expected<std::int32_t> join::sum_flag(process_group& g, device where, std::int32_t value,
                                      duration timeout,
                                      std::vector<std::pair<work, scratch_buffer>>& parking) {
  auto buf = scratch_buffer::make(where, dtype::int32, 1);
  if (!buf) return std::move(buf).error();
  TROUPE_TRY(buf->write(&value));
  auto w = g.allreduce(buf->view(), {reduce_op::sum, timeout});
  // The group bounds the operation by `timeout`; the extra second lets it report first.
  if (auto r = w.wait(timeout + std::chrono::seconds(1)); !r) {
    parking.emplace_back(std::move(w), std::move(*buf));
    return std::move(r).error();
  }
  std::int32_t out = 0;
  TROUPE_TRY(buf->read(&out));
  return out;
}

expected<std::int32_t> join::allreduce_flag(std::int32_t value) {
  return sum_flag(*group_, device_, value, options_.timeout, in_flight_);
}

expected<std::optional<work>> join::notify_join_context(joinable& j) {
  const auto& c = j.config_;
  if (!c.enable || !c.is_first_joinable) return std::optional<work>();
  auto& g = j.join_process_group();
  auto& pending = j.in_flight_;
  std::erase_if(pending, [](const auto& p) { return p.first.is_completed(); });
  // A completed entry's buffer could be reused; the counter is 4 bytes, so take a fresh one.
  auto buf = scratch_buffer::make(j.join_device(), dtype::int32, 1);
  if (!buf) return std::move(buf).error().with_operation("join");
  std::int32_t one = 1;
  TROUPE_TRY(buf->write(&one));
  auto w = g.allreduce(buf->view(), {reduce_op::sum, c.timeout});
  pending.emplace_back(w, std::move(*buf));
  if (c.throw_on_early_termination) {
    auto joined = sum_flag(g, j.join_device(), 0, c.timeout, pending);
    if (!joined) return std::move(joined).error().with_operation("join");
    if (*joined > 0)
      return join_error(errc::aborted,
                        strcat("rank ", g.rank(), " of ", describe(g),
                               ": at least one rank ran out of inputs and the join scope was "
                               "asked to throw on early termination; every rank stops"));
  }
  return std::optional<work>(std::move(w));
}

expected<void> join::finish() {
  if (!open_)
    return join_error(errc::invalid_argument,
                      "this join scope has ended already; finish() runs once per scope");
  if (!options_.enable) {
    close();
    return ok();
  }
  bool is_last_joiner = true;
  bool warned = false;
  // The wait of a rank that ran out of inputs, shadowing the others' collectives.
  trace::span traced("join", "join");
  auto result = [&]() -> expected<void> {
    for (;;) {
      if (shadowed_ > warn_threshold && !warned) {
        warned = true;
        TROUPE_LOG(log_level::warn, "join", "uneven input skew above ", warn_threshold, ": rank ",
                   group_->rank(), " has at least ", warn_threshold,
                   " fewer inputs than ranks still training; skew this large slows training");
      }
      auto nonjoined = allreduce_flag(0);
      if (!nonjoined) return std::move(nonjoined).error().with_operation("join");
      if (*nonjoined == 0) break;
      if (options_.throw_on_early_termination) {
        auto told = allreduce_flag(1);
        if (!told) return std::move(told).error().with_operation("join");
        return join_error(errc::aborted,
                          strcat("rank ", group_->rank(), " of ", describe(*group_),
                                 " ran out of inputs first and the join scope was asked to "
                                 "throw on early termination; every rank stops"));
      }
      for (auto& h : hooks_) TROUPE_TRY(h->main_hook());
      is_last_joiner = false;
      ++shadowed_;
    }
    for (auto& h : hooks_) TROUPE_TRY(h->post_hook(is_last_joiner));
    return ok();
  }();
  if (traced.on())
    traced.args()
        .add("rank", group_->rank())
        .add("shadowed", static_cast<std::uint64_t>(shadowed_))
        .add("last_joiner", is_last_joiner ? "yes" : "no")
        .add("ok", result ? "yes" : "no");
  traced.end();
  close();
  return result;
}

}  // namespace troupe::collectives
