#include <troupe/actors/detail/message_trace.hpp>

namespace troupe::actors::detail {

std::uint64_t message_bytes(const bytes& payload, const std::vector<tensor>& tensors) noexcept {
  std::uint64_t n = payload.size();
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

void message_span::describe(std::string_view actor, std::string_view peer, std::uint64_t bytes) {
  if (!on()) return;
  actor_ = std::string(actor);
  args_.add("actor", actor).add("peer", peer).add("bytes", bytes);
}

void message_span::set_error(std::string_view why) {
  if (on()) args_.add("error", why);
}

void message_span::add(std::string_view key, std::uint64_t value) {
  if (on()) args_.add(key, value);
}

void message_span::end(std::string_view verb, trace::flow f) {
  if (!on()) return;
  const std::int64_t start = start_ns_;
  start_ns_ = 0;
  if (call_ != 0) args_.add("call", call_);
  std::string name(verb);
  name += ' ';
  name += actor_;
  trace::complete("actors", name, start, trace::now_ns(), args_, f, tid_);
}

}  // namespace troupe::actors::detail
