#include <troupe/core/codec.hpp>

namespace troupe {

bytes to_bytes(std::string_view text) {
  auto* p = reinterpret_cast<const std::byte*>(text.data());
  return bytes(p, p + text.size());
}

std::string to_string(std::span<const std::byte> data) {
  return std::string(reinterpret_cast<const char*>(data.data()), data.size());
}

error byte_reader::overrun(std::string_view what, std::size_t need) const {
  return make_error(errc::protocol_error, "truncated input while reading ", what, ": needed ", need,
                    " bytes at offset ", pos_, ", but only ", remaining(), " remain");
}

expected<std::uint8_t> byte_reader::u8(std::string_view what) { return get<std::uint8_t>(what); }

expected<std::int32_t> byte_reader::i32(std::string_view what) {
  auto v = get<std::uint32_t>(what);
  if (!v) return std::move(v).error();
  return static_cast<std::int32_t>(*v);
}

expected<std::int64_t> byte_reader::i64(std::string_view what) {
  auto v = get<std::uint64_t>(what);
  if (!v) return std::move(v).error();
  return static_cast<std::int64_t>(*v);
}

expected<std::string> byte_reader::str(std::string_view what, std::size_t max_len) {
  auto n = get<std::uint32_t>(what);
  if (!n) return std::move(n).error();
  if (*n > max_len)
    return make_error(errc::protocol_error, what, " is ", *n, " bytes long; the limit is ",
                      max_len);
  if (remaining() < *n) return overrun(what, *n);
  std::string s(reinterpret_cast<const char*>(in_.data() + pos_), *n);
  pos_ += *n;
  return s;
}

expected<bytes> byte_reader::blob(std::string_view what, std::size_t max_len) {
  auto n = get<std::uint32_t>(what);
  if (!n) return std::move(n).error();
  if (*n > max_len)
    return make_error(errc::protocol_error, what, " is ", *n, " bytes long; the limit is ",
                      max_len);
  if (remaining() < *n) return overrun(what, *n);
  bytes b(in_.begin() + static_cast<std::ptrdiff_t>(pos_),
          in_.begin() + static_cast<std::ptrdiff_t>(pos_ + *n));
  pos_ += *n;
  return b;
}

}  // namespace troupe
