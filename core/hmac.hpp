// hmac: proving knowledge of a shared secret without sending it. HMAC-SHA256 (OpenSSL's
// libcrypto), a constant-time comparison, and nonces from the kernel's random source. The
// store and RPC handshakes use them (docs/security.md).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>

namespace troupe {

/// An HMAC-SHA256 tag.
using hmac_tag = std::array<std::byte, 32>;

/// HMAC-SHA256 of the concatenation of `parts` under `key`. An empty key is allowed.
hmac_tag hmac_sha256(std::string_view key, std::initializer_list<std::span<const std::byte>> parts);

/// Whether `a` and `b` are equal, in time that depends only on their sizes.
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) noexcept;

/// `bytes` as lowercase hex, two digits each (a nonce or a secret sent as text).
std::string to_hex(std::span<const std::byte> bytes);

/// A nonce: 16 bytes from getrandom. errc::unavailable if the kernel gives none.
expected<std::array<std::byte, 16>> make_nonce();

}  // namespace troupe
