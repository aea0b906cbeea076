// The remote references a worker owns: their values, who holds a share of each, and the
// fetches waiting for a value. One of agent_core's parts (docs/architecture.md): it owns
// its state under one mutex and does no I/O; the core answers the fetches it returns.
//
// Shares travel on different connections from the requests that create values and from
// each other, so the table tolerates every order:
// - an add that overtakes the creating request makes the entry, not ready yet;
// - a release that overtakes its fork's add is remembered, and the add cancels it;
// - a fetch that overtakes the creating request parks in an entry without shares until the
//   request arrives; a parked entry that gets no share within the timeout expires.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/rpc/wire.hpp>

namespace troupe::rpc::detail {

class connection;

class rref_table {
 public:
  /// A fetch waiting for a value: who asked, the request id, and when it arrived (trace
  /// clock; 0 when tracing is off).
  struct waiter {
    std::shared_ptr<connection> c;
    std::uint64_t req = 0;
    std::int64_t since_ns = 0;
  };
  /// What an entry that expired or got its value leaves to answer.
  using answers = std::vector<waiter>;

  /// A request that creates value `id` arrived from `creator`: from now on the entry
  /// exists with the creator's share (fork 0); an add that overtook it may have made it.
  void created(std::uint64_t id, const std::string& creator);

  /// Stores the value (or error) of `id`; returns the fetches that waited for it. Nothing
  /// when every holder released it while the function ran.
  answers set_value(std::uint64_t id, const expected<wire::frame>& value);

  /// Share `fork` of `id` now belongs to `holder` (cancels a release that overtook it).
  void add_share(std::uint64_t id, std::uint64_t fork, std::string holder);

  /// Share `fork` of `id` is released; the entry goes with its last share.
  void release(std::uint64_t id, std::uint64_t fork);

  /// A fetch of `id`: its value when ready (answer it now); nullopt when `w` now waits
  /// (the value is not computed yet, or the fetch overtook the creating request).
  std::optional<expected<wire::frame>> fetch(std::uint64_t id, waiter w);

  /// Removes entries parked without a share for `limit` or longer at `now`; returns each
  /// id with the fetches that waited on it (to be answered not_found). Cheap when none is
  /// parked.
  std::vector<std::pair<std::uint64_t, answers>> expire_parked(clock::time_point now,
                                                               duration limit);

  /// Drops every share held by `worker` (it died or left) and the entries left without
  /// one; returns {shares dropped, entries freed}.
  std::pair<std::size_t, std::size_t> drop_shares_of(const std::string& worker);

  /// The entries held now (diagnostics, tests).
  std::size_t size() const;

 private:
  struct entry {
    bool ready = false;
    std::optional<expected<wire::frame>> value;
    std::map<std::uint64_t, std::string> shares;  // fork -> holding worker
    answers waiters;
    std::optional<clock::time_point> parked_since;
  };
  mutable std::mutex mu_;
  std::map<std::uint64_t, entry> entries_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> early_releases_;  // (id, fork)
  std::atomic<bool> has_parked_{false};
};

}  // namespace troupe::rpc::detail
