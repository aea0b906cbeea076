// server_core: the state every connection of one tcp_store_server shares: the key table,
// the requests parked until their keys exist, and the set of open connections. One mutex
// guards it all; it is held only for table work and never while touching a socket.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <troupe/core/tls.hpp>
#include <troupe/store/detail/kv_table.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace troupe::detail {

class server_connection;

/// A get or wait whose reply waits for its keys to appear.
struct parked_request {
  std::weak_ptr<server_connection> conn;
  const server_connection* owner = nullptr;
  std::uint64_t id = 0;
  bool is_get = false;
  std::vector<std::string> keys;
  std::string parked_on;
};

/// A reply that a write made ready for some (other) connection.
struct wake_reply {
  std::shared_ptr<server_connection> conn;
  bytes frame;
};

struct server_core {
  tcp_store_server_options options;
  std::string name;
  /// The TLS context of TCP connections (made from options.tls); null: plain.
  std::shared_ptr<const tls::context> tls;

  std::mutex mu;
  kv_table table;
  std::unordered_map<std::string, std::vector<std::shared_ptr<parked_request>>> parked;
  std::map<std::pair<const server_connection*, std::uint64_t>, std::shared_ptr<parked_request>>
      waiters;
  std::unordered_map<const server_connection*, std::weak_ptr<server_connection>> connections;
  std::atomic<std::size_t> queued_output{0};  // bytes in every connection's outbox

  /// Under mu: parks `w` on its first missing key, or returns false if none is missing.
  bool park(const std::shared_ptr<parked_request>& w);
  /// Under mu: the replies of the requests that the write of `key` completed (each frame
  /// built once, straight from the table); re-parks those still missing another key.
  void wake(const std::string& key, std::vector<wake_reply>& out);
  /// Forgets the parked request `id` of connection `c` (a client-side timeout).
  void cancel(const server_connection* c, std::uint64_t id);
  /// Forgets every parked request of `c` and `c` itself (it closed).
  void forget_connection(const server_connection* c);

 private:
  void unpark(const std::shared_ptr<parked_request>& w);
};

}  // namespace troupe::detail
