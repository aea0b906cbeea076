// The TCP store wire format (docs/store-protocol.md): length-prefixed binary frames.
// Encoding and decoding only; no sockets here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>

namespace troupe::detail::wire {

/// "TRST" read as a little-endian u32; the first field of a hello.
inline constexpr std::uint32_t magic = 0x54535254;
/// 2: set_quiet; 3: the secret is proven with HMAC-SHA256 over both sides' nonces
/// (challenge, auth) and never sent.
inline constexpr std::uint32_t version = 3;
/// The u32 length that precedes every frame body.
inline constexpr std::size_t length_size = 4;
/// kind (u8) + request id (u64): the smallest valid body.
inline constexpr std::size_t min_body = 9;
inline constexpr std::size_t default_max_frame = std::size_t{64} << 20;
/// The largest frame a server reads from a peer that has not completed its hello: a hello
/// (a secret of at most 4096 bytes and a few fixed fields) fits with room to spare, and an
/// unauthenticated peer cannot make the server allocate more than this.
inline constexpr std::size_t max_hello_size = 8192;

enum class kind : std::uint8_t {
  hello = 1,
  hello_ok = 2,
  reply = 3,
  /// server -> client, after a hello, when the server has a secret.
  challenge = 4,
  /// client -> server, the answer to a challenge.
  auth = 5,
  set = 16,
  get = 17,
  check = 18,
  add = 19,
  compare_set = 20,
  erase = 21,
  wait = 22,
  num_keys = 23,
  cancel = 24,
  /// A set that the server applies without replying (tcp_store::set_nowait).
  set_quiet = 25,
};

/// Status byte of a reply: 0 is success, else an errc value.
inline constexpr std::uint8_t status_ok = 0;

/// Builds one frame: length, kind, request id, then the payload written through writer().
class frame_builder {
 public:
  /// `payload_hint`: the payload's expected size, reserved up front so that building a
  /// frame costs one allocation.
  frame_builder(kind k, std::uint64_t request_id, std::size_t payload_hint = 0);
  byte_writer& writer() noexcept { return w_; }
  /// The finished frame, length prefix included.
  bytes finish() &&;

 private:
  bytes buf_;
  byte_writer w_;
};

struct hello {
  std::uint32_t magic = 0;
  std::uint32_t version = 0;
  /// The client's nonce (16 random bytes; in version 2 this field carried the secret).
  std::string nonce;
  std::string client;
};

/// The server's nonce, and its proof that it knows the secret.
struct challenge {
  std::string nonce;
  std::string proof;
};

/// The client's proof; `has_secret` false when the client has none to prove.
struct auth {
  bool has_secret = false;
  std::string proof;
};

/// The proof that `role` ("server" or "client") knows `secret`: HMAC-SHA256 over the role
/// and both nonces, so that a proof is good for one connection and one direction only.
std::string handshake_proof(std::string_view role, std::string_view secret,
                            std::string_view client_nonce, std::string_view server_nonce);

/// A decoded request body.
struct request {
  kind op{};
  std::uint64_t id = 0;
  std::string key;                      // set get add compare_set erase; prefix for num_keys
  std::vector<std::string> keys;        // check wait
  bytes value;                          // set; desired of compare_set
  std::optional<bytes> expected_value;  // compare_set
  std::int64_t delta = 0;               // add
  std::uint64_t target = 0;             // cancel: the request to forget
};

/// The kind and request id at the head of a body.
expected<std::pair<kind, std::uint64_t>> peek(std::span<const std::byte> body);

bytes encode_hello(const hello& h);
expected<hello> decode_hello(std::span<const std::byte> body);
bytes encode_hello_ok(std::string_view server);
bytes encode_challenge(const challenge& c);
/// `body` is a whole challenge frame body (its kind already peeked).
expected<challenge> decode_challenge(std::span<const std::byte> body);
bytes encode_auth(const auth& a);
expected<auth> decode_auth(std::span<const std::byte> body);

/// Decodes a request body (any kind from set to cancel); protocol_error says what is wrong.
expected<request> decode_request(std::span<const std::byte> body);

/// A reply frame carrying success and a payload written by `fill(byte_writer&)`, about
/// `payload_hint` bytes long.
template <class Fill>
bytes encode_reply_ok(std::uint64_t id, std::size_t payload_hint, Fill&& fill) {
  frame_builder f(kind::reply, id, payload_hint + 1);
  f.writer().u8(status_ok);
  fill(f.writer());
  return std::move(f).finish();
}
bytes encode_reply_error(std::uint64_t id, const error& e);

/// A reply's status and, for errors, the error; on success the reader is left at the
/// payload.
expected<void> decode_reply_status(byte_reader& r);

}  // namespace troupe::detail::wire
