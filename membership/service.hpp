// membership::service: this process's place in the job's membership. It joins the job by
// proposing an epoch that adds it, beats a heartbeat, watches every other member's heartbeat,
// declares the silent ones dead, and tells subscribers about every new epoch in order.
//
// Threads: one heartbeat thread and one watcher thread per service. Subscribers run on the
// watcher thread, never under the service's lock. Every blocking call takes a timeout.
// Design and record layout: docs/membership.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <troupe/core/time.hpp>
#include <troupe/membership/epoch.hpp>
#include <troupe/store/store.hpp>

namespace troupe::membership {

/// Reads the current epoch record from `s` (epoch 0 when none was written yet).
expected<epoch> read_epoch(store& s, duration timeout);

/// Reads the record of epoch `number` from the history, waiting for it up to `timeout`.
expected<epoch> read_epoch(store& s, std::uint64_t number, duration timeout);

/// Applies `change` to the current epoch in `s` with compare_set, re-applying it to
/// whichever epoch won until it lands or changes nothing. Returns the epoch that holds the
/// change (the current one when there was nothing to do). Fails with timeout after
/// `timeout`, already_exists when a joiner's name is held by another member, or the
/// store's error. Safe to call from many threads and processes at once.
expected<epoch> apply_change(store& s, const epoch_change& change, duration timeout);

/// How a service joins and watches. Zero durations take the settings' values.
struct service_options {
  /// This member's name: unique in the job, no white space.
  std::string name;
  /// This member's host; empty: this machine's host name.
  std::string host;
  /// A member whose heartbeat stays unchanged this long is declared dead;
  /// zero: TROUPE_HEARTBEAT_TIMEOUT (10s).
  duration heartbeat_timeout = duration::zero();
  /// How often to beat and to check the others; zero: TROUPE_HEARTBEAT_INTERVAL, else
  /// heartbeat_timeout / 10.
  duration heartbeat_interval = duration::zero();
  /// The timeout of each store call the threads make.
  duration op_timeout = std::chrono::seconds(10);
};

/// The heartbeat timeout in force: TROUPE_HEARTBEAT_TIMEOUT, else 10 s.
duration heartbeat_timeout_from_env();

/// The heartbeat interval in force for `timeout`: TROUPE_HEARTBEAT_INTERVAL, else timeout/10.
duration heartbeat_interval_from_env(duration timeout);

/// This process as a member of the job. Make one with join(); it leaves on shutdown().
class service {
 public:
  /// Called with the epoch before and the new one, in epoch order, on the watcher thread.
  using callback = std::function<void(const epoch& before, const epoch& after)>;

  /// Joins the job whose membership lives in `s` (already scoped, see docs/membership.md),
  /// waiting up to `timeout` for the epoch that adds this process, then starts beating and
  /// watching. Fails with invalid_argument for a bad name or host, already_exists when the
  /// name is held, timeout, or the store's error. `s` must outlive the service.
  static expected<std::unique_ptr<service>> join(std::shared_ptr<store> s, service_options o,
                                                 duration timeout);

  service(const service&) = delete;
  service& operator=(const service&) = delete;
  /// Same as shutdown(op_timeout).
  ~service();

  /// This member as it joined (its rank is the one it had in the epoch that added it).
  const member& self() const noexcept;
  /// The options in force: join()'s, with zero durations replaced by the settings'.
  const service_options& options() const noexcept;
  /// The latest epoch this service has seen.
  epoch current() const;
  /// This member's rank in current(), or -1 once it is out.
  int rank() const;

  /// Waits until the epoch number is at least `number`, up to `timeout`; returns that
  /// epoch. Fails with timeout, or with the sticky error when the service stopped first.
  expected<epoch> wait_for_epoch(std::uint64_t number, duration timeout);
  /// Waits until `predicate(current())` holds, up to `timeout`; returns that epoch.
  expected<epoch> wait_until(const std::function<bool(const epoch&)>& predicate, duration timeout);

  /// Calls `cb` for every epoch after the current one, in order, from the watcher thread;
  /// returns an id for unsubscribe(). A caller that also reads current() after subscribing
  /// races that thread: the epoch it reads may be older than one `cb` already got, so keep
  /// whichever has the higher number.
  std::uint64_t on_epoch(callback cb);
  /// Stops calling the callback `id`; returns whether it was subscribed.
  bool unsubscribe(std::uint64_t id);

  /// Proposes an epoch without the member `name` (dead, as seen by `reason`), up to
  /// `timeout`; returns the epoch without it. A member already out changes nothing.
  expected<epoch> declare_dead(std::string_view name, std::string_view reason, duration timeout);

  /// The sticky error: set when this member was left out of an epoch
  /// (membership_changed) or the store failed; ok while it takes part.
  expected<void> health() const;

  /// Leaves the job in an orderly way (an epoch without this member), then stops the
  /// threads. Idempotent; waits at most `timeout`; returns the first error each time.
  expected<void> shutdown(duration timeout);

 private:
  struct state;
  explicit service(std::shared_ptr<state> st);
  std::shared_ptr<state> state_;
};

}  // namespace troupe::membership
