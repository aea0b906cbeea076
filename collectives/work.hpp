// work: the handle of one asynchronous collective. Completed exactly once, by the
// backend, with success or with the error that ended it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <troupe/core/future.hpp>

namespace troupe::collectives {

namespace detail {
struct work_state;
// A counted reference to a work's state, shared by the work handles and the completer. The
// count is the state's own: a work is made with both references at once, no atomic
// addition for them, and a small collective's bookkeeping is mostly such additions.
class state_ref {
 public:
  state_ref() = default;
  explicit state_ref(work_state* adopted) noexcept : p_(adopted) {}
  state_ref(const state_ref& o) noexcept;
  state_ref& operator=(const state_ref& o) noexcept;
  state_ref(state_ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  state_ref& operator=(state_ref&& o) noexcept;
  ~state_ref();
  work_state& operator*() const noexcept { return *p_; }
  work_state* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  friend bool operator==(const state_ref& r, std::nullptr_t) noexcept { return r.p_ == nullptr; }

 private:
  work_state* p_ = nullptr;
};
}  // namespace detail

class work {
 public:
  /// A handle that is already completed with `result`.
  static work completed(expected<void> result, std::string description = {});

  /// The producer side: the backend keeps the completer, the user gets the work.
  class completer {
   public:
    /// Completes the work; later calls are ignored. Returns whether this call won.
    bool complete(expected<void> result) const;
    bool is_completed() const;
    /// The work's description, as made.
    const std::string& description() const;

   private:
    friend class work;
    detail::state_ref state_;
  };
  /// A pending work described as e.g. "allreduce #4 on group 'world'".
  static std::pair<work, completer> make(std::string description);
  /// The same, for an operation that its waiter may run itself: wait() calls `help` on the
  /// waiting thread, before it blocks, whenever the work is still pending. `help` runs the
  /// operation there if it has not started yet (and completes the work), or returns at
  /// once; it must not throw. A waiter so spares the two thread hops of a backend worker.
  static std::pair<work, completer> make(std::string description, std::function<void()> help);
  /// The same, for an operation whose backend may hold it back a moment for its waiter:
  /// get_future() and is_completed() call `urge` (which must not block or throw) while the
  /// work is pending, so that a caller who never calls wait() does not wait for that moment.
  static std::pair<work, completer> make(std::string description, std::function<void()> help,
                                         std::function<void()> urge);
  /// What a backend's works may share instead of a `help` and an `urge` each: the work made
  /// with `key` calls help(key) and urge(key), with the contracts above. A backend makes
  /// one for all its works, so that a work costs no allocation for them. `where` (e.g.
  /// "group 'world'") completes the descriptions of the works made by make_lazy().
  struct hooks {
    std::function<void(std::uint64_t)> help;
    std::function<void(std::uint64_t)> urge;
    std::string where;
  };
  /// A thread keeps up to 16 states of dropped works for its next ones, with the `shared`
  /// hooks they were made with while another reference to those exists: a work costs no
  /// allocation, and a backend's next work no count on its hooks.
  static std::pair<work, completer> make(std::string description,
                                         const std::shared_ptr<const hooks>& shared,
                                         std::uint64_t key);
  /// The same (`shared` must not be null), with the description "<op> #<key> on
  /// <shared->where>" made on first use (an error, a log, description()) instead of for
  /// every operation. `op` must outlive the work (a literal).
  static std::pair<work, completer> make_lazy(std::string_view op,
                                              const std::shared_ptr<const hooks>& shared,
                                              std::uint64_t key);

  work() = default;

  /// Waits up to `timeout` for completion. Returns the operation's result, or
  /// errc::timeout (the work stays pending and may be waited on again).
  expected<void> wait(duration timeout) const;
  /// wait() with the process-wide default timeout.
  expected<void> wait() const { return wait(default_timeout()); }

  /// True once the operation finished, successfully or not.
  bool is_completed() const;
  /// The error that ended the operation, if it failed.
  std::optional<troupe::error> error() const;
  /// A new future completed with the result; may be called several times.
  future<void> get_future() const;
  /// What this work is, for logs.
  const std::string& description() const;
  bool valid() const noexcept { return static_cast<bool>(state_); }

 private:
  // `s` (with its two references) as a pending work with `shared` and `key`.
  static std::pair<work, completer> make_pending(detail::work_state* s,
                                                 const std::shared_ptr<const hooks>& shared,
                                                 std::uint64_t key);
  detail::state_ref state_;
};

}  // namespace troupe::collectives
