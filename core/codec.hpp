// byte_writer / byte_reader: the little-endian binary encoding shared by troupe's wire
// formats (store frames, RPC messages, exchanged device records). A reader never reads
// past its input: every overrun is an errc::protocol_error naming what was being read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe {

using bytes = std::vector<std::byte>;

/// Copies text into bytes and back.
bytes to_bytes(std::string_view text);
std::string to_string(std::span<const std::byte> data);

/// Appends little-endian values to a byte buffer.
class byte_writer {
 public:
  /// Appends to `out`, which must outlive the writer.
  explicit byte_writer(bytes& out) : out_(out) {}
  ///@{
  /// Appends one integer, little-endian, in its width (signed ones as two's complement).
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u32(std::uint32_t v) { put(v); }
  void u64(std::uint64_t v) { put(v); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v)); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v)); }
  ///@}
  /// A u32 length, then the bytes.
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  /// A u32 length, then the bytes.
  void blob(std::span<const std::byte> b) {
    u32(static_cast<std::uint32_t>(b.size()));
    raw(b.data(), b.size());
  }
  /// The `n` bytes at `p`, with no length.
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }

 private:
  template <class U>
  void put(U v) {
    std::byte tmp[sizeof(U)];
    for (std::size_t i = 0; i < sizeof(U); ++i)
      tmp[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
    out_.insert(out_.end(), tmp, tmp + sizeof(U));
  }
  bytes& out_;
};

/// Reads what a byte_writer wrote, never past the end of its input.
class byte_reader {
 public:
  /// Reads `in`, which must outlive the reader.
  explicit byte_reader(std::span<const std::byte> in) : in_(in) {}

  /// Bytes not read yet.
  std::size_t remaining() const noexcept { return in_.size() - pos_; }
  /// Whether everything has been read.
  bool at_end() const noexcept { return pos_ == in_.size(); }

  ///@{
  /// Reads one little-endian integer; an errc::protocol_error naming `what` when the
  /// input ends first.
  expected<std::uint8_t> u8(std::string_view what);
  expected<std::uint32_t> u32(std::string_view what) { return get<std::uint32_t>(what); }
  expected<std::uint64_t> u64(std::string_view what) { return get<std::uint64_t>(what); }
  expected<std::int32_t> i32(std::string_view what);
  expected<std::int64_t> i64(std::string_view what);
  ///@}
  /// Reads a length-prefixed string of at most `max_len` bytes.
  expected<std::string> str(std::string_view what, std::size_t max_len = 1u << 30);
  /// Reads a length-prefixed byte string of at most `max_len` bytes.
  expected<bytes> blob(std::string_view what, std::size_t max_len = 1u << 30);

 private:
  error overrun(std::string_view what, std::size_t need) const;
  template <class U>
  expected<U> get(std::string_view what) {
    if (remaining() < sizeof(U)) return overrun(what, sizeof(U));
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i)
      v |= static_cast<U>(std::to_integer<std::uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += sizeof(U);
    return v;
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace troupe
