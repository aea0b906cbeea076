// membership_token: a store-based mutex that lets one worker at a time join or leave a
// dynamic group, and that survives the death of its holder.
//
// How it works, over any store (compare_set is the only atomic step it needs):
// - The token is one key. Its value is a holder record, "held <nonce> <seq> <ttl_ms>
//   <holder>", or "free <nonce>" after an orderly release. The nonce is random per
//   acquisition, so a record is never written twice.
// - acquire() swaps in its own record with compare_set, from "absent" or from a free
//   record. The holder's guard runs a background thread that rewrites the record with
//   seq + 1 every refresh interval (compare_set from the exact record it wrote last).
// - A waiter that sees the same held record, unchanged, for the record's ttl on its own
//   steady clock takes the holder for dead and swaps in its own record with compare_set
//   from the record it saw. No clocks are compared across machines.
// - Waiting for an orderly release is event-driven: the releasing holder writes
//   "<key>/released/<nonce>" after freeing the token, and waiters block in get() on that
//   key; they wake at least every ttl / 4 to re-read the record for expiry checks.
// - If a refresh finds a foreign record (the holder was too slow and lost the token),
//   the guard reports held() == false and logs a warning; the work it protected must be
//   treated as unprotected from then on.
#pragma once

#include <memory>
#include <string>

#include <troupe/store/store.hpp>

namespace troupe {

struct membership_token_options {
  /// A holder whose record has not changed for this long is taken for dead.
  duration ttl = std::chrono::seconds(10);
  /// How often the holder rewrites its record; zero means ttl / 3.
  duration refresh_interval = duration::zero();
  /// The timeout of each store call made while holding or releasing.
  duration op_timeout = std::chrono::seconds(10);
};

/// Holds the token; releases it on destruction. Move-only. The store must outlive it.
class membership_guard {
 public:
  membership_guard() = default;
  membership_guard(membership_guard&&) noexcept;
  membership_guard& operator=(membership_guard&&) noexcept;
  ~membership_guard();

  /// False once released, or if the token was lost to a waiter (the holder stalled).
  bool held() const;
  /// Stops refreshing and frees the token for the next waiter. Idempotent.
  expected<void> release();
  /// The record this guard wrote, for logs.
  std::string record() const;

 private:
  friend expected<membership_guard> acquire_membership_token(store&, std::string_view,
                                                             std::string_view, duration,
                                                             const membership_token_options&);
  struct state;
  explicit membership_guard(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

/// Takes the token at `key` for `holder` (a worker name, shown to waiters), waiting up to
/// `timeout` for the current holder to release it or to expire. The timeout error names
/// the current holder.
expected<membership_guard> acquire_membership_token(store& s, std::string_view key,
                                                    std::string_view holder, duration timeout,
                                                    const membership_token_options& options = {});

}  // namespace troupe
