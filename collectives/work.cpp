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
  std::function<void()> help;                // set before the work is handed out, never changed
  std::function<void()> urge;                // the same
  std::shared_ptr<const work::hooks> hooks;  // or these, with key (the same)
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

bool can_help(const work_state& s) { return s.help || (s.hooks && s.hooks->help); }
bool can_urge(const work_state& s) { return s.urge || (s.hooks && s.hooks->urge); }
void help(const work_state& s) {
  if (s.help)
    s.help();
  else
    s.hooks->help(s.key);
}
void urge(const work_state& s) {
  if (s.urge)
    s.urge();
  else
    s.hooks->urge(s.key);
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

std::pair<work, work::completer> work::make(std::string description,
                                            std::shared_ptr<const hooks> shared,
                                            std::uint64_t key) {
  auto made = make(std::move(description));
  made.first.state_->hooks = std::move(shared);
  made.first.state_->key = key;
  return made;
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
  auto finished = [&] {
    std::lock_guard lk(s.mu);
    return s.result;
  };
  if (detail::can_help(s)) {
    if (auto r = finished()) return *r;
    detail::help(s);  // runs it here if it is next in line
  }
  if (detail::can_urge(s)) {
    if (auto r = finished()) return *r;  // run by help: the usual case for small operations
    // Not run by help (another operation was ahead of it): no holding back.
    detail::urge(s);
  }
  std::unique_lock lk(s.mu);
  if (s.result) return *s.result;
  if (!s.cv.wait_until(lk, deadline::after(timeout).time_point(),
                       [&] { return s.result.has_value(); }))
    return make_error(errc::timeout, detail::describe(s), " did not complete within ",
                      format_duration(timeout), " (it is still running)");
  return *s.result;
}

bool work::is_completed() const {
  if (!state_) return true;
  bool done = false;
  {
    std::lock_guard lk(state_->mu);
    done = state_->result.has_value();
  }
  if (!done && detail::can_urge(*state_)) detail::urge(*state_);
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
  if (detail::can_urge(*state_)) {
    bool done = false;
    {
      std::lock_guard lk(state_->mu);
      done = state_->result.has_value();
    }
    if (!done) detail::urge(*state_);
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

const std::string& work::completer::description() const {
  static const std::string empty;
  return state_ ? detail::describe(*state_) : empty;
}

const std::string& work::description() const {
  static const std::string empty;
  return state_ ? detail::describe(*state_) : empty;
}

}  // namespace troupe::collectives
