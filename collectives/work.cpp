#include <troupe/collectives/work.hpp>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::collectives {

namespace detail {
struct work_state {
  // Either given whole, or made on first use from op, key and where (describe()).
  std::string description;
  std::string_view op;
  std::shared_ptr<const std::string> where;
  std::once_flag described;
  // Called with key; set before the work is handed out, never changed (null: none).
  std::shared_ptr<const work::hooks> hooks;
  std::uint64_t key = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<expected<void>> result;
  std::vector<promise<void>> waiters;
};

namespace {

const std::string& describe(work_state& s) {
  if (s.where)
    std::call_once(s.described, [&] {
      s.description.reserve(s.op.size() + 24 + s.where->size());
      s.description.append(s.op).append(" #").append(std::to_string(s.key)).append(" on ");
      s.description.append(*s.where);
    });
  return s.description;
}

bool done(work_state& s) {
  std::lock_guard lk(s.mu);
  return s.result.has_value();
}
// Calls hooks->help or hooks->urge (`which`) with the work's key, if it has that hook and
// is not done yet.
void call(work_state& s, std::function<void(std::uint64_t)> work::hooks::*which) {
  if (!s.hooks) return;
  const auto& f = (*s.hooks).*which;
  if (f && !done(s)) f(s.key);
}

}  // namespace

}  // namespace detail

std::pair<work, work::completer> work::make(std::string description) {
  return make(std::move(description), {});
}

std::pair<work, work::completer> work::make(std::string description, std::function<void()> help) {
  return make(std::move(description), std::move(help), {});
}

std::pair<work, work::completer> work::make(std::string description, std::function<void()> help,
                                            std::function<void()> urge) {
  if (!help && !urge) return make(std::move(description), nullptr, 0);
  auto own = std::make_shared<const hooks>(hooks{
      help ? [h = std::move(help)](std::uint64_t) { h(); } : std::function<void(std::uint64_t)>(),
      urge ? [u = std::move(urge)](std::uint64_t) { u(); } : std::function<void(std::uint64_t)>()});
  return make(std::move(description), std::move(own), 0);
}

std::pair<work, work::completer> work::make(std::string description,
                                            std::shared_ptr<const hooks> shared,
                                            std::uint64_t key) {
  auto s = std::make_shared<detail::work_state>();
  s->description = std::move(description);
  s->hooks = std::move(shared);
  s->key = key;
  work w;
  w.state_ = s;
  completer c;
  c.state_ = std::move(s);
  return {std::move(w), std::move(c)};
}

std::pair<work, work::completer> work::make(std::string_view op,
                                            std::shared_ptr<const std::string> where,
                                            std::shared_ptr<const hooks> shared,
                                            std::uint64_t key) {
  auto made = make(std::string(), std::move(shared), key);
  made.first.state_->op = op;
  made.first.state_->where = std::move(where);
  return made;
}

work work::completed(expected<void> result, std::string description) {
  auto [w, c] = make(std::move(description));
  c.complete(std::move(result));
  return w;
}

bool work::completer::complete(expected<void> result) const {
  if (!state_) return false;
  std::vector<promise<void>> waiters;
  {
    std::lock_guard lk(state_->mu);
    if (state_->result) return false;
    state_->result = result;
    waiters.swap(state_->waiters);
  }
  state_->cv.notify_all();
  // Continuations run outside the lock, on this thread.
  for (auto& p : waiters) p.set(result);
  return true;
}

bool work::completer::is_completed() const {
  if (!state_) return true;
  std::lock_guard lk(state_->mu);
  return state_->result.has_value();
}

static troupe::error empty_work_error() {
  return troupe::error(errc::invalid_argument, "this work handle is empty (default-built)");
}

expected<void> work::wait(duration timeout) const {
  if (!state_) return empty_work_error();
  auto& s = *state_;
  detail::call(s, &hooks::help);  // runs it here if it is next in line
  std::unique_lock lk(s.mu);
  // Done already (run by help: the usual case for small operations): no deadline to
  // compute, and no clock to read.
  if (s.result) return *s.result;
  if (s.hooks && s.hooks->urge) {
    // Not run by help (another operation was ahead of it): no holding back.
    lk.unlock();
    s.hooks->urge(s.key);
    lk.lock();
  }
  if (!s.cv.wait_until(lk, deadline::after(timeout).time_point(),
                       [&] { return s.result.has_value(); }))
    return make_error(errc::timeout, detail::describe(s), " did not complete within ",
                      format_duration(timeout), " (it is still running)");
  return *s.result;
}

bool work::is_completed() const {
  if (!state_) return true;
  if (detail::done(*state_)) return true;
  detail::call(*state_, &hooks::urge);
  return false;
}

std::optional<troupe::error> work::error() const {
  if (!state_) return empty_work_error();
  std::lock_guard lk(state_->mu);
  if (state_->result && !*state_->result) return state_->result->error();
  return std::nullopt;
}

future<void> work::get_future() const {
  if (!state_) return make_error_future<void>(empty_work_error());
  detail::call(*state_, &hooks::urge);
  promise<void> p;
  auto f = p.get_future();
  std::unique_lock lk(state_->mu);
  if (state_->result) {
    auto r = *state_->result;
    lk.unlock();
    p.set(std::move(r));
  } else {
    state_->waiters.push_back(std::move(p));
  }
  return f;
}

const std::string& work::completer::description() const {
  static const std::string empty;
  return state_ ? detail::describe(*state_) : empty;
}

const std::string& work::description() const {
  static const std::string empty;
  return state_ ? detail::describe(*state_) : empty;
}

}  // namespace troupe::collectives
