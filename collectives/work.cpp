#include <troupe/collectives/work.hpp>

#include <array>
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
  std::atomic<bool> described{false};  // description made from op (describe())
  // Called with key; set before the work is handed out, never changed while it is out
  // (null: none). A state kept for reuse keeps them, so that the next work of the same
  // backend takes over its reference instead of counting one more (see take_state()).
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

  // Back to a new state's values, for reuse: nobody holds a reference. The hooks stay (see
  // `hooks`); the strings and the waiters' vector keep their memory.
  void reset() noexcept {
    refs.store(2, std::memory_order_relaxed);
    description.clear();
    op = {};
    described.store(false, std::memory_order_relaxed);
    key = 0;
    state.store(pending, std::memory_order_relaxed);
    listeners.store(0, std::memory_order_relaxed);
    result = expected<void>();
    waiters.clear();  // pending only if the work was dropped uncompleted: broken, as deleted
  }
};

namespace {

// A thread's states kept for reuse: the last reference to a state gives it to the thread
// that drops it, up to `keep`, and a new work takes one from its thread before it
// allocates. A small collective's work so costs no allocation and no making and unmaking
// of its lock and condition variable (with the allocation, a tenth of a 4 KiB allgather's
// bookkeeping in a group of one). Works are made and dropped on the caller's thread: its
// own states come back to it.
class spare_states {
 public:
  static constexpr std::size_t keep = 16;
  ~spare_states();
  // A state with its two references, reused or new.
  work_state* take() {
    if (n_ == 0) return new work_state();
    work_state* s = states_[--n_];
    s->reset();
    return s;
  }
  // Takes `s`, which nobody references any more, or deletes it when full. Hooks that only
  // this state holds (a work's own, or those of a backend that is gone) go at once.
  void give(work_state* s) noexcept {
    if (n_ == keep) {
      delete s;
      return;
    }
    if (s->hooks.use_count() == 1) s->hooks.reset();
    states_[n_++] = s;
  }

 private:
  std::array<work_state*, keep> states_{};
  std::size_t n_ = 0;
};

// Set when the thread's spare_states is destroyed (thread exit): a work dropped after
// that, by a later destructor on the same thread, deletes its state. A plain flag, valid
// until the thread ends.
thread_local bool spares_gone = false;

spare_states::~spare_states() {
  spares_gone = true;
  for (std::size_t i = 0; i < n_; ++i) delete states_[i];
}

spare_states& spares() {
  thread_local spare_states kept;
  return kept;
}

work_state* take_state() { return spares_gone ? new work_state() : spares().take(); }

void give_state(work_state* s) noexcept {
  if (spares_gone)
    delete s;
  else
    spares().give(s);
}

const std::string& describe(work_state& s) {
  if (!s.op.empty() && !s.described.load(std::memory_order_acquire)) {
    // Made at most once per work, on an error or a log: one lock for every work is enough.
    static std::mutex making;
    std::lock_guard lk(making);
    if (!s.described.load(std::memory_order_relaxed)) {
      const std::string& where = s.hooks->where;
      s.description.reserve(s.op.size() + 24 + where.size());
      s.description.append(s.op).append(" #").append(std::to_string(s.key)).append(" on ");
      s.description.append(where);
      s.described.store(true, std::memory_order_release);
    }
  }
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

// The last reference keeps the state for reuse on its thread (spare_states), or deletes
// it; acquire-release, so that either comes after every other holder's use of it.
state_ref::~state_ref() {
  if (p_ && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) give_state(p_);
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
  if (!help && !urge) return make(std::move(description), std::shared_ptr<const hooks>(), 0);
  auto own = std::make_shared<const hooks>(hooks{
      help ? [h = std::move(help)](std::uint64_t) { h(); } : std::function<void(std::uint64_t)>(),
      urge ? [u = std::move(urge)](std::uint64_t) { u(); } : std::function<void(std::uint64_t)>(),
      {}});
  return make(std::move(description), own, 0);
}

std::pair<work, work::completer> work::make_pending(detail::work_state* s,
                                                    const std::shared_ptr<const hooks>& shared,
                                                    std::uint64_t key) {
  // A kept state of the same backend holds its hooks already: no count taken and dropped.
  if (s->hooks != shared) s->hooks = shared;
  s->key = key;
  work w;
  w.state_ = detail::state_ref(s);
  completer c;
  c.state_ = detail::state_ref(s);
  return {std::move(w), std::move(c)};
}

std::pair<work, work::completer> work::make(std::string description,
                                            const std::shared_ptr<const hooks>& shared,
                                            std::uint64_t key) {
  auto* s = detail::take_state();
  s->description = std::move(description);
  return make_pending(s, shared, key);
}

std::pair<work, work::completer> work::make_lazy(std::string_view op,
                                                 const std::shared_ptr<const hooks>& shared,
                                                 std::uint64_t key) {
  auto* s = detail::take_state();
  s->op = op;
  return make_pending(s, shared, key);
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
