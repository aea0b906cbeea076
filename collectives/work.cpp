#include <troupe/collectives/work.hpp>

#include <condition_variable>
#include <mutex>
#include <vector>

namespace troupe::collectives {

namespace detail {
struct work_state {
  std::string description;
  std::function<void()> help;  // set before the work is handed out, never changed
  std::function<void()> urge;  // the same
  std::mutex mu;
  std::condition_variable cv;
  std::optional<expected<void>> result;
  std::vector<promise<void>> waiters;
};
}  // namespace detail

std::pair<work, work::completer> work::make(std::string description) {
  return make(std::move(description), {});
}

std::pair<work, work::completer> work::make(std::string description, std::function<void()> help) {
  return make(std::move(description), std::move(help), {});
}

std::pair<work, work::completer> work::make(std::string description, std::function<void()> help,
                                            std::function<void()> urge) {
  auto s = std::make_shared<detail::work_state>();
  s->description = std::move(description);
  s->help = std::move(help);
  s->urge = std::move(urge);
  work w;
  w.state_ = s;
  completer c;
  c.state_ = std::move(s);
  return {std::move(w), std::move(c)};
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
  if (state_->help) {
    bool done = false;
    {
      std::lock_guard lk(state_->mu);
      done = state_->result.has_value();
    }
    if (!done) state_->help();
  }
  if (state_->urge) {
    // Not run by help (another operation was ahead of it): no holding back.
    bool done = false;
    {
      std::lock_guard lk(state_->mu);
      done = state_->result.has_value();
    }
    if (!done) state_->urge();
  }
  std::unique_lock lk(state_->mu);
  if (!state_->cv.wait_until(lk, deadline::after(timeout).time_point(),
                             [&] { return state_->result.has_value(); }))
    return make_error(errc::timeout, state_->description, " did not complete within ",
                      format_duration(timeout), " (it is still running)");
  return *state_->result;
}

bool work::is_completed() const {
  if (!state_) return true;
  bool done = false;
  {
    std::lock_guard lk(state_->mu);
    done = state_->result.has_value();
  }
  if (!done && state_->urge) state_->urge();
  return done;
}

std::optional<troupe::error> work::error() const {
  if (!state_) return empty_work_error();
  std::lock_guard lk(state_->mu);
  if (state_->result && !*state_->result) return state_->result->error();
  return std::nullopt;
}

future<void> work::get_future() const {
  if (!state_) return make_error_future<void>(empty_work_error());
  if (state_->urge) {
    bool done = false;
    {
      std::lock_guard lk(state_->mu);
      done = state_->result.has_value();
    }
    if (!done) state_->urge();
  }
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

const std::string& work::description() const {
  static const std::string empty;
  return state_ ? state_->description : empty;
}

}  // namespace troupe::collectives
