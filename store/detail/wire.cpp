#include <troupe/store/detail/wire.hpp>

#include <algorithm>

#include <troupe/core/hmac.hpp>

namespace troupe::detail::wire {

namespace {

constexpr std::size_t max_keys_per_request = 1u << 20;

error bad(std::string_view what) {
  return make_error(errc::protocol_error, "malformed store frame: ", what);
}

expected<std::vector<std::string>> read_keys(byte_reader& r) {
  auto n = r.u32("key count");
  if (!n) return std::move(n).error();
  if (*n > max_keys_per_request || *n > r.remaining() / 4)
    return bad(strcat("key count ", *n, " is larger than the frame can hold"));
  std::vector<std::string> keys;
  keys.reserve(*n);
  for (std::uint32_t i = 0; i < *n; ++i) {
    auto k = r.str("key");
    if (!k) return std::move(k).error();
    keys.push_back(std::move(*k));
  }
  return keys;
}

}  // namespace

frame_builder::frame_builder(kind k, std::uint64_t request_id, std::size_t payload_hint)
    : w_(buf_) {
  buf_.reserve(length_size + min_body + std::max<std::size_t>(payload_hint, 32));
  w_.u32(0);  // patched by finish()
  w_.u8(static_cast<std::uint8_t>(k));
  w_.u64(request_id);
}

bytes frame_builder::finish() && {
  auto n = static_cast<std::uint32_t>(buf_.size() - length_size);
  for (std::size_t i = 0; i < length_size; ++i)
    buf_[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  return std::move(buf_);
}

expected<std::pair<kind, std::uint64_t>> peek(std::span<const std::byte> body) {
  byte_reader r(body);
  auto k = r.u8("frame kind");
  if (!k) return std::move(k).error();
  auto id = r.u64("request id");
  if (!id) return std::move(id).error();
  return std::pair{static_cast<kind>(*k), *id};
}

bytes encode_hello(const hello& h) {
  frame_builder f(kind::hello, 0);
  f.writer().u32(h.magic);
  f.writer().u32(h.version);
  f.writer().str(h.nonce);
  f.writer().str(h.client);
  return std::move(f).finish();
}

expected<hello> decode_hello(std::span<const std::byte> body) {
  byte_reader r(body);
  auto k = r.u8("frame kind");
  if (!k) return std::move(k).error();
  if (*k != static_cast<std::uint8_t>(kind::hello))
    return bad(strcat("expected a hello frame first, got kind ", int(*k)));
  TROUPE_TRY(r.u64("request id"));
  hello h;
  auto m = r.u32("magic");
  if (!m) return std::move(m).error();
  h.magic = *m;
  if (h.magic != magic) return bad("the hello does not start with the troupe store magic");
  auto v = r.u32("version");
  if (!v) return std::move(v).error();
  h.version = *v;
  auto s = r.str("nonce", 4096);
  if (!s) return std::move(s).error();
  h.nonce = std::move(*s);
  auto c = r.str("client name", 4096);
  if (!c) return std::move(c).error();
  h.client = std::move(*c);
  return h;
}

bytes encode_hello_ok(std::string_view server) {
  frame_builder f(kind::hello_ok, 0);
  f.writer().u32(version);
  f.writer().str(server);
  return std::move(f).finish();
}

std::string handshake_proof(std::string_view role, std::string_view secret,
                            std::string_view client_nonce, std::string_view server_nonce) {
  auto span_of = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  static constexpr std::string_view domain = "troupe store handshake ";
  auto tag = hmac_sha256(
      secret, {span_of(domain), span_of(role), span_of(client_nonce), span_of(server_nonce)});
  return std::string(reinterpret_cast<const char*>(tag.data()), tag.size());
}

bytes encode_challenge(const challenge& c) {
  frame_builder f(kind::challenge, 0);
  f.writer().str(c.nonce);
  f.writer().str(c.proof);
  return std::move(f).finish();
}

expected<challenge> decode_challenge(std::span<const std::byte> body) {
  byte_reader r(body);
  auto k = r.u8("frame kind");
  if (!k) return std::move(k).error();
  if (*k != static_cast<std::uint8_t>(kind::challenge))
    return bad(strcat("expected a challenge, got frame kind ", int(*k)));
  TROUPE_TRY(r.u64("request id"));
  challenge c;
  auto n = r.str("server nonce", 256);
  if (!n) return std::move(n).error();
  c.nonce = std::move(*n);
  auto p = r.str("server proof", 256);
  if (!p) return std::move(p).error();
  c.proof = std::move(*p);
  return c;
}

bytes encode_auth(const auth& a) {
  frame_builder f(kind::auth, 0);
  f.writer().u8(a.has_secret ? 1 : 0);
  f.writer().str(a.proof);
  return std::move(f).finish();
}

expected<auth> decode_auth(std::span<const std::byte> body) {
  byte_reader r(body);
  auto k = r.u8("frame kind");
  if (!k) return std::move(k).error();
  if (*k != static_cast<std::uint8_t>(kind::auth))
    return bad(strcat("expected the answer to the challenge, got frame kind ", int(*k)));
  TROUPE_TRY(r.u64("request id"));
  auth a;
  auto h = r.u8("has secret");
  if (!h) return std::move(h).error();
  a.has_secret = *h != 0;
  auto p = r.str("client proof", 256);
  if (!p) return std::move(p).error();
  a.proof = std::move(*p);
  return a;
}

expected<request> decode_request(std::span<const std::byte> body) {
  byte_reader r(body);
  auto k = r.u8("frame kind");
  if (!k) return std::move(k).error();
  auto id = r.u64("request id");
  if (!id) return std::move(id).error();
  request q;
  q.op = static_cast<kind>(*k);
  q.id = *id;
  auto read_key = [&]() -> expected<void> {
    auto key = r.str("key");
    if (!key) return std::move(key).error();
    q.key = std::move(*key);
    return ok();
  };
  switch (q.op) {
    case kind::set:
    case kind::set_quiet: {
      TROUPE_TRY(read_key());
      auto v = r.blob("value");
      if (!v) return std::move(v).error();
      q.value = std::move(*v);
      break;
    }
    case kind::get:
    case kind::erase:
    case kind::num_keys:
      TROUPE_TRY(read_key());
      break;
    case kind::check:
    case kind::wait: {
      auto keys = read_keys(r);
      if (!keys) return std::move(keys).error();
      q.keys = std::move(*keys);
      break;
    }
    case kind::add: {
      TROUPE_TRY(read_key());
      auto d = r.i64("delta");
      if (!d) return std::move(d).error();
      q.delta = *d;
      break;
    }
    case kind::compare_set: {
      TROUPE_TRY(read_key());
      auto has = r.u8("expected-value flag");
      if (!has) return std::move(has).error();
      if (*has > 1) return bad("the expected-value flag must be 0 or 1");
      if (*has == 1) {
        auto e = r.blob("expected value");
        if (!e) return std::move(e).error();
        q.expected_value = std::move(*e);
      }
      auto v = r.blob("desired value");
      if (!v) return std::move(v).error();
      q.value = std::move(*v);
      break;
    }
    case kind::cancel: {
      auto t = r.u64("cancelled request id");
      if (!t) return std::move(t).error();
      q.target = *t;
      break;
    }
    default:
      return bad(strcat("unknown request kind ", int(*k)));
  }
  if (!r.at_end()) return bad(strcat(r.remaining(), " unexpected bytes after the request"));
  return q;
}

bytes encode_reply_error(std::uint64_t id, const error& e) {
  frame_builder f(kind::reply, id);
  f.writer().u8(static_cast<std::uint8_t>(e.code()));
  f.writer().str(e.message());
  return std::move(f).finish();
}

expected<void> decode_reply_status(byte_reader& r) {
  auto s = r.u8("reply status");
  if (!s) return std::move(s).error();
  if (*s == status_ok) return ok();
  auto msg = r.str("error message");
  if (!msg) return std::move(msg).error();
  errc code = static_cast<errc>(*s);
  if (to_string(code) == "unknown_error") code = errc::internal;
  return error(code, std::move(*msg));
}

}  // namespace troupe::detail::wire
