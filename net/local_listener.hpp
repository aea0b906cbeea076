// local_listener: the local (Unix domain) socket a server listens on beside a TCP
// listener bound to a loopback address, so that clients on this host skip the TCP stack
// (docs/rpc.md, "Local sockets"; docs/store-protocol.md). Its name comes from
// core/net_address.hpp's local_socket_name(service, host, port): abstract, so it lives in
// this host's network namespace and vanishes with the process. Used by the RPC agent and
// the TCP store server.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <boost/asio.hpp>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::net {

using local_acceptor = boost::asio::local::stream_protocol::acceptor;

/// A listening local socket for `service` ("rpc", "store") beside the TCP listener at
/// `bound`:`port`, on `io`. None when `bound` is not a loopback address or the socket cannot
/// be made (its name taken, no such support): that only loses the fast path, so it is
/// logged at debug level under `component`, with `who` and what clients do instead.
std::optional<local_acceptor> listen_beside(boost::asio::io_context& io, std::string_view service,
                                            const boost::asio::ip::address& bound,
                                            std::uint16_t port, std::string_view component,
                                            std::string_view who);

}  // namespace troupe::net
