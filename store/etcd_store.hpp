// etcd_store: the store for multi-node jobs, kept in an etcd 3.4+ cluster and spoken to
// through etcd's v3 JSON gateway (HTTP or HTTPS, no gRPC dependency).
//
// - https:// endpoints (or tls.enabled) speak TLS: etcd's certificate is verified against
//   tls.ca_file and the endpoint's host; tls.cert_file/key_file answer etcd's
//   --client-cert-auth. With `user`, the store signs in and sends etcd's token with every
//   request (renewed when etcd forgets it).
// - All keys live under the job's prefix; num_keys() counts only that prefix.
// - With attach_lease (off by default) the store grants itself a lease at connect and
//   attaches every key it writes to it. A background thread keeps the lease alive; if this
//   process dies, etcd deletes its keys after the lease TTL. close() (and the destructor) revokes
//   the lease, which deletes them at once. If the lease is lost anyway (etcd unreachable for longer
//   than the TTL), every later call fails with errc::connection_lost: this participant's keys are
//   gone.
// - compare_set and add are etcd transactions; get and wait block on a watch stream.
//
// Threading and errors are as for every store (store/store.hpp); design notes in
// docs/store-etcd.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <troupe/core/time.hpp>
#include <troupe/store/prefix_count.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

/// TLS towards etcd. All files are PEM.
struct etcd_tls_options {
  /// Speak https (also implied by an https:// endpoint).
  bool enabled = false;
  /// The CA that signed etcd's server certificate; empty: the system's trusted CAs.
  std::string ca_file;
  /// A client certificate and its key, for etcd's --client-cert-auth (both or neither).
  std::string cert_file;
  std::string key_file;
};

struct etcd_store_options {
  /// etcd client URLs as host:port, http://host:port or https://host:port (all alike).
  /// Calls go to the first one that accepts a connection; a refused one is skipped.
  std::vector<std::string> endpoints{"127.0.0.1:2379"};
  /// TLS (see above); connect() fails at once when a file cannot be loaded.
  etcd_tls_options tls{};
  /// An etcd user (etcd's `auth enable`) and its password; empty user: no sign-in.
  std::string user{};
  std::string password{};
  /// Every key is stored as `prefix + key`: give each job (and each round) its own. A
  /// non-empty prefix that does not end in '/' gets one appended.
  std::string prefix = "/troupe/";
  /// Whether keys are attached to this store's lease (see above). Off by default: a key
  /// belongs to the lease of its last writer, so shared rendezvous keys (counters, barrier
  /// flags) would vanish when that writer exits while others still need them. Turn it on
  /// for a store that holds one participant's own records (liveness, membership tokens),
  /// which must disappear when it dies. When off, keys outlive their writer and the job
  /// erases its prefix when done.
  bool attach_lease = false;
  /// Lifetime of this participant's keys after it stops renewing its lease (etcd rounds
  /// up to whole seconds, and refuses less than about 2 s).
  duration lease_ttl = std::chrono::seconds(10);
  /// Default timeout of the calls that take none; also bounds connect().
  duration timeout = default_timeout();
  /// How long close() may spend revoking the lease.
  duration close_timeout = std::chrono::seconds(5);
};

class etcd_store final : public store, public prefix_countable {
 public:
  /// Connects to etcd and grants this store's lease. Fails with connection_lost when no
  /// endpoint answers, invalid_argument for a malformed endpoint or option.
  static expected<std::unique_ptr<etcd_store>> connect(const etcd_store_options& options);

  /// Closes the store (see close()).
  ~etcd_store() override;

  expected<void> set(std::string_view key, std::span<const std::byte> value,
                     duration timeout) override;
  expected<bytes> get(std::string_view key, duration timeout) override;
  expected<bool> check(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> add(std::string_view key, std::int64_t delta, duration timeout) override;
  expected<bytes> compare_set(std::string_view key, const std::optional<bytes>& expected_value,
                              std::span<const std::byte> desired, duration timeout) override;
  expected<bool> erase(std::string_view key, duration timeout) override;
  expected<void> wait(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> num_keys(duration timeout) override;
  /// Counts the keys under prefix() + `prefix` (lets a prefix_store over etcd count).
  expected<std::int64_t> num_keys_with_prefix(std::string_view prefix, duration timeout) override;
  /// "etcd_store 127.0.0.1:2379 prefix '/troupe/job1/'".
  std::string describe() const override;

  using store::add;
  using store::get;
  using store::set;
  using store::wait;

  /// Stops the keep-alive thread, makes pending calls fail with errc::shut_down, and
  /// revokes the lease (deleting this store's keys), spending at most close_timeout.
  /// Idempotent; later calls fail with errc::shut_down.
  void close();

  /// The normalized key prefix, e.g. "/troupe/job1/".
  const std::string& prefix() const noexcept;
  /// The etcd lease every key written by this store is attached to (0: attach_lease off).
  std::int64_t lease_id() const noexcept;

  /// For tests of participant failure: stops renewing the lease and forgets it without
  /// revoking, as a crashed process would, so its keys expire after the TTL.
  void abandon_lease_for_testing();

  struct impl;

 private:
  explicit etcd_store(std::shared_ptr<impl> state);
  std::shared_ptr<impl> impl_;
};

/// Builds an etcd_store behind the plain store interface.
expected<std::unique_ptr<store>> connect_etcd_store(const etcd_store_options& options);

/// Reads a store URL of the form
///   etcd://host:port[,host:port...][/prefix][?option=value&...]
/// into options (other fields keep their defaults). The prefix path becomes the key
/// prefix ("etcd://h:2379/job7" -> "/job7/"); without one it is "/troupe/". Options:
/// lease_ttl=<duration>, attach_lease=true|false, protocol=http|https, cacert=PATH,
/// cert=PATH, key=PATH, user=NAME, password_file=PATH (the password is read from the file,
/// never carried in the URL). Percent-escapes in values are decoded.
expected<etcd_store_options> parse_etcd_store_url(std::string_view url);

}  // namespace troupe
