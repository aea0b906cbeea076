#include <troupe/net/local_listener.hpp>

#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>

namespace troupe::net {

std::optional<local_acceptor> listen_beside(boost::asio::io_context& io, std::string_view service,
                                            const boost::asio::ip::address& bound,
                                            std::uint16_t port, std::string_view component,
                                            std::string_view who) {
  if (!bound.is_loopback()) return std::nullopt;
  boost::asio::local::stream_protocol::endpoint ep(
      local_socket_name(service, bound.to_string(), port));
  boost::system::error_code ec;
  local_acceptor a(io);
  a.open(ep.protocol(), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (ec) {
    TROUPE_LOG(log_level::debug, component, who, ": no local socket (", ec.message(),
               "); clients on this host use TCP");
    return std::nullopt;
  }
  return a;
}

}  // namespace troupe::net
