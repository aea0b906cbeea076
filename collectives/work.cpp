#include <troupe/collectives/work.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::collectives {

namespace detail {
struct work_state {
  // User-provided, so that make_shared does not zero the whole object before building it
  // (a `rep stos` that was a tenth of a small operation's bookkeeping).
  work_state() {}

  // The references (state_ref): the work and the completer at first.
  std::atomic<std::uint32_t> refs{2};
  // Either given whole, or made on first use from op, key and hooks->where (describe()).
  std::string description;
  std::string_view op;
  std::once_flag described;
  // Called with key; set before the work is handed out, never changed (null: none).
  std::shared_ptr<const work::hooks> hooks;
  std::uint64_t key = 0;
  // pending, then completing (one completer won and writes `result`), then done (`result`
  // is final and may be read without the lock). A waiter that finds the work done, as one
  // that ran it itself does, takes no lock at all.
  std::atomic<std::uint32_t> state{pending};
  // Threads asleep on cv and futures in `waiters`, counted under mu: the completer takes the
  // lock only when there are some (see work::completer::complete).
  std::atomic<std::uint32_t> listeners{0};
  expected<void> result;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<promise<void>> waiters;

  static constexpr std::uint32_t pending = 0, completing = 1, done = 2;
  bool is_done() const noexcept { return state.load(std::memory_order_acquire) == done; }
};

namespace {

const std::string& describe(work_state& s) {
  if (!s.op.empty())
    std::call_once(s.described, [&] {
      const std::string& where = s.hooks->where;
      s.description.reserve(s.op.size() + 24 + where.size());
      s.description.append(s.op).append(" #").append(std::to_string(s.key)).append(" on ");
      s.description.append(where);
    });
  return s.description;
}

// Calls hooks->help or hooks->urge (`which`) with the work's key, if it has that hook and
// is not done yet.
void call(work_state& s, std::function<void(std::uint64_t)> work::hooks::*which) {
  if (!s.hooks) return;
  const auto& f = (*s.hooks).*which;
  if (f && !s.is_done()) f(s.key);
}

}  // namespace

state_ref::state_ref(const state_ref& o) noexcept : p_(o.p_) {
  if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
}

state_ref& state_ref::operator=(const state_ref& o) noexcept {
  state_ref copy(o);
  std::swap(p_, copy.p_);
  return *this;
}

state_ref& state_ref::operator=(state_ref&& o) noexcept {
  state_ref taken(std::move(o));
  std::swap(p_, taken.p_);
  return *this;
}

// The last reference deletes the state; acquire-release, so that its deletion comes after
// every other holder's use of it.
state_ref::~state_ref() {
  if (p_ && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete p_;
}

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
      urge ? [u = std::move(urge)](std::uint64_t) { u(); } : std::function<void(std::uint64_t)>(),
      {}});
  return make(std::move(description), std::move(own), 0);
}

std::pair<work, work::completer> work::make(std::string description,
                                            std::shared_ptr<const hooks> shared,
                                            std::uint64_t key) {
  auto* s = new detail::work_state();  // with its two references
  s->description = std::move(description);
  s->hooks = std::move(shared);
  s->key = key;
  work w;
  w.state_ = detail::state_ref(s);
  completer c;
  c.state_ = detail::state_ref(s);
  return {std::move(w), std::move(c)};
}

std::pair<work, work::completer> work::make_lazy(std::string_view op,
                                                 std::shared_ptr<const hooks> shared,
                                                 std::uint64_t key) {
  auto made = make(std::string(), std::move(shared), key);
  made.first.state_->op = op;
  return made;
}

work work::completed(expected<void> result, std::string description) {
  auto [w, c] = make(std::move(description));
  c.complete(std::move(result));
  return w;
}

bool work::completer::complete(expected<void> result) const {
  if (!state_) return false;
  auto& s = *state_;
  std::uint32_t expect = detail::work_state::pending;
  if (!s.state.compare_exchange_strong(expect, detail::work_state::completing,
                                       std::memory_order_acquire))
    return false;
  s.result = std::move(result);
  // Sequentially consistent, as the listeners' count and its check under mu: either a
  // listener that counted itself sees the work done, or this sees the count and wakes it.
  s.state.store(detail::work_state::done);
  if (s.listeners.load() == 0) return true;
  std::vector<promise<void>> waiters;
  {
    std::lock_guard lk(s.mu);
    waiters.swap(s.waiters);
  }
  s.cv.notify_all();
  // Continuations run outside the lock, on this thread.
  for (auto& p : waiters) p.set(expected<void>(s.result));
  return true;
}

bool work::completer::is_completed() const { return !state_ || state_->is_done(); }

static troupe::error empty_work_error() {
  return troupe::error(errc::invalid_argument, "this work handle is empty (default-built)");
}

expected<void> work::wait(duration timeout) const {
  if (!state_) return empty_work_error();
  auto& s = *state_;
  detail::call(s, &hooks::help);  // runs it here if it is next in line
  // Done already (run by help: the usual case for small operations): no lock, no deadline
  // to compute, and no clock to read.
  if (s.is_done()) return s.result;
  detail::call(s, &hooks::urge);  // not run by help: no holding back
  std::unique_lock lk(s.mu);
  s.listeners.fetch_add(1);
  const bool done = s.cv.wait_until(lk, deadline::after(timeout).time_point(),
                                    [&] { return s.state.load() == detail::work_state::done; });
  s.listeners.fetch_sub(1);
  if (!done)
    return make_error(errc::timeout, detail::describe(s), " did not complete within ",
                      format_duration(timeout), " (it is still running)");
  return s.result;
}

bool work::is_completed() const {
  if (!state_ || state_->is_done()) return true;
  detail::call(*state_, &hooks::urge);
  return false;
}

std::optional<troupe::error> work::error() const {
  if (!state_) return empty_work_error();
  if (state_->is_done() && !state_->result) return state_->result.error();
  return std::nullopt;
}

future<void> work::get_future() const {
  if (!state_) return make_error_future<void>(empty_work_error());
  auto& s = *state_;
  detail::call(s, &hooks::urge);
  promise<void> p;
  auto f = p.get_future();
  if (!s.is_done()) {
    std::unique_lock lk(s.mu);
    s.listeners.fetch_add(1);  // counted for good: the completer takes the lock to set it
    if (s.state.load() != detail::work_state::done) {
      s.waiters.push_back(std::move(p));
      return f;
    }
  }
  p.set(expected<void>(s.result));
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
