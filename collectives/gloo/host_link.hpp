// A TCP connection of its own between two members of a gloo group on different hosts, for
// the hierarchical path's step across hosts (one between every two hosts' members of a
// slice). Internal to
// collectives/gloo; used by the thread running the group's current operation (abort() and
// close() excepted, which are safe from any thread).
//
// Why not Gloo's pair between the same two members: Gloo moves a transfer's bytes on its
// event-loop thread and completes it through a condition variable, so each arrival wakes
// two threads, and a send waits for the receiver to announce its buffer first. Here the
// calling thread moves the bytes itself, sending and receiving at once on a non-blocking
// socket, and waits the way the shared-memory waits do: it yields its CPU between attempts
// for a while, then sleeps in poll(). Between two simulated hosts of two members each, the
// whole hierarchical allreduce of 1-16 MiB took 0.6-0.9x the time it took with the step
// across hosts over Gloo's pairs, and between three hosts 0.5-0.9x (bench/RESULTS.md, "a
// link of its own").
//
// Each exchange sends a header (the exchange's number and its byte count) before the
// payload, so members that disagree on the operation fail with invalid_argument instead of
// reading each other's bytes. The member that connects proves it read the listener's
// offer from the job's store: it sends back the offer's random token, and a connection
// that does not is closed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_link {

struct link_options {
  /// Whether this member listens (the other connects). Exactly one of the two does.
  bool listens = false;
  /// The address this member binds when it listens: its gloo address (member_addresses).
  std::string address;
  /// The other member, as errors name it (e.g. "rank 2 on host 1").
  std::string peer;
  duration timeout = std::chrono::seconds(30);
};

class link {
 public:
  /// Collective between the two members, through `s` (namespaced for this pair): the
  /// listener binds `address` on a port the kernel picks and publishes it with a token, the
  /// other connects and sends the token back. Fails within the timeout (errc::timeout
  /// naming the peer; errc::invalid_argument for an address that cannot be bound).
  static expected<std::unique_ptr<link>> open(store& s, const link_options& o);

  ~link();
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  /// Sends `out` to the peer and receives the peer's bytes into `in` at once; both members
  /// call it with the same `seq` and sizes (out.size() == in.size()). Fails with
  /// errc::timeout at `deadline` (naming the peer and the bytes still missing),
  /// errc::connection_lost when the peer closed the connection or it broke,
  /// errc::invalid_argument when the peer is at another exchange or size, errc::aborted
  /// after abort(). After a failure the link is unusable.
  expected<void> exchange(std::uint64_t seq, std::span<const std::byte> out,
                          std::span<std::byte> in, clock::time_point deadline);

  /// One link's part of exchange_all(): send `out` to its peer, receive its bytes into `in`.
  struct transfer {
    link* via;
    std::span<const std::byte> out;
    std::span<std::byte> in;
  };
  /// exchange() over several links at once (each at most once), driven together, so that
  /// every peer's bytes move while the others' do; fails as exchange() does, with the
  /// first link that fails.
  static expected<void> exchange_all(std::uint64_t seq, std::span<const transfer> ts,
                                     clock::time_point deadline);

  /// Makes the current and later exchanges fail with errc::aborted. Idempotent.
  void abort() noexcept;
  /// Shuts the connection down, so that the peer's exchanges fail with
  /// errc::connection_lost at once, and this member's too. Idempotent.
  void close() noexcept;

 private:
  friend struct link_access;
  struct progress;
  link(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  expected<bool> step(progress& p);
  troupe::error failure(errc code, std::string why) const;
  troupe::error broken(int err) const;
  int fd_;
  std::string peer_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> closed_{false};
};

}  // namespace troupe::collectives::gloo_link
