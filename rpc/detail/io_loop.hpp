// io_loop: how an agent's I/O threads run Asio. Plain `io_context::run()` sleeps in epoll
// whenever nothing is ready, and waking a sleeping thread costs tens of microseconds on a
// busy machine, once per message of a request/response exchange. With a spin window, a
// thread that has just read from a socket keeps polling (without blocking, yielding the
// CPU between empty polls) until that long has passed without another read, and only
// then sleeps; the next message of an exchange then finds it awake. Timers and posted
// work do not count as activity, so an idle agent sleeps.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <boost/asio/io_context.hpp>
#include <chrono>

namespace troupe::rpc::detail {

/// Runs `io` on this thread until it stops, spinning for up to `spin` after socket reads
/// (zero: plain run()).
void run_io_loop(boost::asio::io_context& io, std::chrono::microseconds spin);

/// Connections call this when a read completed on this thread (cheap: a counter).
void note_socket_activity() noexcept;

}  // namespace troupe::rpc::detail
