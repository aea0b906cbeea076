#include <troupe/world/trace_clock.hpp>

#include <charconv>
#include <string>

#include <troupe/core/strcat.hpp>
#include <troupe/core/trace.hpp>

namespace troupe::detail {

namespace {

std::string key(int rank, int sample, std::string_view what) {
  return strcat("troupe/trace-clock/", rank, "/", sample, "/", what);
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

expected<std::int64_t> read_clock(const bytes& b, const std::string& k) {
  std::int64_t v = 0;
  const char* first = reinterpret_cast<const char*>(b.data());
  auto [end, ec] = std::from_chars(first, first + b.size(), v);
  if (ec != std::errc{} || end != first + b.size())
    return make_error(errc::protocol_error, "trace clock key ", k, " holds no clock reading");
  return v;
}

duration left(deadline until) {
  return std::max<duration>(std::chrono::duration_cast<duration>(until.remaining()),
                            std::chrono::milliseconds(1));
}

}  // namespace

expected<void> measure_trace_clock(store& s, int rank, int size, int samples, deadline until) {
  if (rank == 0) {
    trace::set_clock(0, 0, "reference (rank 0)");
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < samples; ++k) {
        auto ping = s.get(key(r, k, "ping"), left(until));
        if (!ping)
          return make_error(ping.error().code(), "rank ", r, "'s trace clock ping ", k,
                            " did not come: ", ping.error().message());
        const std::string now = std::to_string(trace::now_ns());
        TROUPE_TRY(s.set(key(r, k, "pong"), as_bytes(now), left(until)));
      }
    return ok();
  }
  std::int64_t best_rtt = -1, best_offset = 0;
  for (int k = 0; k < samples; ++k) {
    const std::int64_t t0 = trace::now_ns();
    TROUPE_TRY(s.set(key(rank, k, "ping"), as_bytes(std::to_string(t0)), left(until)));
    const std::string pong_key = key(rank, k, "pong");
    auto pong = s.get(pong_key, left(until));
    const std::int64_t t1 = trace::now_ns();
    if (!pong)
      return make_error(pong.error().code(), "rank 0 did not answer trace clock ping ", k, ": ",
                        pong.error().message());
    auto theirs = read_clock(*pong, pong_key);
    if (!theirs) return std::move(theirs).error();
    if (best_rtt < 0 || t1 - t0 < best_rtt) {
      best_rtt = t1 - t0;
      best_offset = t0 + (t1 - t0) / 2 - *theirs;
    }
  }
  trace::set_clock(best_offset, best_rtt / 2, strcat("store ping to rank 0, best of ", samples));
  return ok();
}

}  // namespace troupe::detail
