#include <troupe/core/hmac.hpp>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace troupe {

hmac_tag hmac_sha256(std::string_view key,
                     std::initializer_list<std::span<const std::byte>> parts) {
  hmac_tag out{};
  // OpenSSL 3's one-shot HMAC needs one buffer; the handshakes hash well under 1 KiB.
  std::size_t total = 0;
  for (auto p : parts) total += p.size();
  std::vector<unsigned char> data;
  data.reserve(total);
  for (auto p : parts) {
    auto* b = reinterpret_cast<const unsigned char*>(p.data());
    data.insert(data.end(), b, b + p.size());
  }
  unsigned int len = 0;
  static const unsigned char empty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&empty) : key.data();
  ::HMAC(EVP_sha256(), k, static_cast<int>(key.size()), data.empty() ? &empty : data.data(),
         data.size(), reinterpret_cast<unsigned char*>(out.data()), &len);
  return out;
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < n; ++i) diff |= std::to_integer<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (auto b : bytes) {
    out += digits[std::to_integer<unsigned>(b) >> 4];
    out += digits[std::to_integer<unsigned>(b) & 15];
  }
  return out;
}

expected<std::array<std::byte, 16>> make_nonce() {
  std::array<std::byte, 16> n{};
  std::size_t got = 0;
  for (int tries = 0; got < n.size() && tries < 100; ++tries) {
    auto r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r > 0)
      got += static_cast<std::size_t>(r);
    else if (r < 0 && errno != EINTR)
      break;
  }
  if (got < n.size())
    return make_error(errc::unavailable, "getrandom failed: ", std::strerror(errno));
  return n;
}

}  // namespace troupe
