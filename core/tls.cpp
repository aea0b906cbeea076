#include <troupe/core/tls.hpp>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <troupe/core/strcat.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace troupe::tls {

namespace {

SSL_CTX* ctx_of(const context& c) { return static_cast<SSL_CTX*>(c.native()); }

// The reasons OpenSSL queued on this thread, oldest first, "; "-separated; clears the queue.
std::string drain_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    std::string text = r ? r : strcat("OpenSSL error ", e);
    if (out.find(text) != std::string::npos) continue;
    out += (out.empty() ? "" : "; ") + text;
  }
  return out;
}

// A file a setting names must exist, be readable and hold PEM.
expected<void> check_file(std::string_view setting, const std::string& path) {
  if (path.empty())
    return make_error(errc::invalid_argument, "TLS needs ", setting,
                      " as well: set TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA together "
                      "(or none of them, for no TLS)");
  std::ifstream in(path);
  if (!in) {
    int err = errno;
    return make_error(errc::invalid_argument, "cannot read ", setting, " file '", path,
                      "': ", std::strerror(err));
  }
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  if (head.find("-----BEGIN ") == std::string::npos)
    return make_error(errc::invalid_argument, setting, " file '", path,
                      "' is not PEM (no -----BEGIN line)");
  return ok();
}

}  // namespace

expected<std::shared_ptr<const context>> context::make(const config& c, setting_names names) {
  TROUPE_TRY(check_file(names.cert, c.cert));
  TROUPE_TRY(check_file(names.key, c.key));
  TROUPE_TRY(check_file(names.ca, c.ca));
  ERR_clear_error();
  std::shared_ptr<context> out(new context());
  out->files_ = c;
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr)
    return make_error(errc::internal, "cannot create a TLS context: ", drain_errors());
  out->ctx_ = ctx;
  auto fail = [&](std::string_view setting, const std::string& path, std::string_view what) {
    return make_error(errc::invalid_argument, setting, " file '", path, "' ", what, ": ",
                      drain_errors());
  };
  // TLS 1.3 (1.2 for an older peer), AES-GCM only: AES-128 first, as fast as it gets with
  // AES-NI and ample for a job's lifetime; no CBC, no RSA key exchange, no ChaCha20.
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384") != 1 ||
      SSL_CTX_set_cipher_list(ctx,
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                              "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384") != 1)
    return make_error(errc::internal, "cannot set the TLS ciphers: ", drain_errors());
  // Connections live as long as the job: no session resumption, no tickets to send.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(ctx, 0);
  if (SSL_CTX_use_certificate_chain_file(ctx, c.cert.c_str()) != 1)
    return fail(names.cert, c.cert, "holds no usable certificate");
  if (SSL_CTX_use_PrivateKey_file(ctx, c.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    const unsigned long e = ERR_peek_last_error();
    if (ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH ||
        ERR_GET_REASON(e) == X509_R_KEY_TYPE_MISMATCH)
      return make_error(errc::invalid_argument, names.key, " file '", c.key,
                        "' is not the key of the certificate in ", names.cert, " file '", c.cert,
                        "': ", drain_errors());
    return fail(names.key, c.key, "holds no usable private key (it must not be encrypted)");
  }
  if (SSL_CTX_check_private_key(ctx) != 1)
    return make_error(errc::invalid_argument, names.key, " file '", c.key,
                      "' is not the key of the certificate in ", names.cert, " file '", c.cert,
                      "': ", drain_errors());
  if (SSL_CTX_load_verify_locations(ctx, c.ca.c_str(), nullptr) != 1)
    return fail(names.ca, c.ca, "holds no usable CA certificate");
  // Mutual: each side demands the other's certificate and checks it against the job's CA.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return std::shared_ptr<const context>(std::move(out));
}

context::~context() { SSL_CTX_free(static_cast<SSL_CTX*>(ctx_)); }

namespace {

// A BIO over a session's buffers: reads take from `in` (retry when it is used up), writes
// append to `out`. Its data pointer is the session's buffers.
template <class Buffers>
BIO_METHOD* buffer_bio_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "troupe tls buffer");
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    BIO_meth_set_write(m, [](BIO* b, const char* data, int len) -> int {
      BIO_clear_retry_flags(b);
      auto* io = static_cast<Buffers*>(BIO_get_data(b));
      if (len <= 0) return 0;
      auto* p = reinterpret_cast<const std::byte*>(data);
      io->out.insert(io->out.end(), p, p + len);
      return len;
    });
    BIO_meth_set_read(m, [](BIO* b, char* data, int len) -> int {
      BIO_clear_retry_flags(b);
      auto* io = static_cast<Buffers*>(BIO_get_data(b));
      const std::size_t left = io->in.size() - io->in_pos;
      if (left == 0) {
        BIO_set_retry_read(b);
        return -1;
      }
      const std::size_t n = std::min(left, static_cast<std::size_t>(len));
      std::memcpy(data, io->in.data() + io->in_pos, n);
      io->in_pos += n;
      if (io->in_pos == io->in.size()) {
        io->in.clear();
        io->in_pos = 0;
      }
      return static_cast<int>(n);
    });
    BIO_meth_set_ctrl(m, [](BIO* b, int cmd, long, void*) -> long {
      auto* io = static_cast<Buffers*>(BIO_get_data(b));
      switch (cmd) {
        case BIO_CTRL_FLUSH:
          return 1;
        case BIO_CTRL_PENDING:
          return static_cast<long>(io->in.size() - io->in_pos);
        case BIO_CTRL_WPENDING:
          return static_cast<long>(io->out.size());
        default:
          return 0;
      }
    });
    return m;
  }();
  return method;
}

}  // namespace

expected<std::unique_ptr<session>> session::make(std::shared_ptr<const context> ctx, bool client) {
  std::unique_ptr<session> s(new session());
  s->ctx_ = std::move(ctx);
  s->client_ = client;
  SSL* ssl = SSL_new(ctx_of(*s->ctx_));
  if (ssl == nullptr)
    return make_error(errc::internal, "cannot create a TLS session: ", drain_errors());
  s->ssl_ = ssl;
  BIO_METHOD* method = buffer_bio_method<buffers>();
  BIO* in = method ? BIO_new(method) : nullptr;
  BIO* out = method ? BIO_new(method) : nullptr;
  if (in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    return make_error(errc::internal, "cannot create TLS buffers: ", drain_errors());
  }
  BIO_set_data(in, s->io_.get());
  BIO_set_data(out, s->io_.get());
  SSL_set_bio(ssl, in, out);  // the SSL owns both from here
  if (client)
    SSL_set_connect_state(ssl);
  else
    SSL_set_accept_state(ssl);
  return s;
}

session::~session() { SSL_free(static_cast<SSL*>(ssl_)); }

void session::put_input(std::span<const std::byte> ciphertext) {
  auto& in = io_->in;
  if (io_->in_pos > 0 && io_->in_pos >= in.size() / 2) {  // keep the unread tail in front
    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(io_->in_pos));
    io_->in_pos = 0;
  }
  in.insert(in.end(), ciphertext.begin(), ciphertext.end());
}

error session::failure(int ret, std::string_view during) {
  SSL* ssl = static_cast<SSL*>(ssl_);
  const int kind = SSL_get_error(ssl, ret);
  if (kind == SSL_ERROR_ZERO_RETURN) {
    ERR_clear_error();
    return make_error(errc::connection_lost, "the peer closed the TLS session");
  }
  const long verify = SSL_get_verify_result(ssl);
  std::string reasons = drain_errors();
  if (reasons.empty()) reasons = strcat("SSL error ", kind);
  const auto& f = ctx_->files();
  const bool peer_refused_us = reasons.find("alert") != std::string::npos &&
                               (reasons.find("unknown ca") != std::string::npos ||
                                reasons.find("bad certificate") != std::string::npos ||
                                reasons.find("certificate unknown") != std::string::npos ||
                                reasons.find("certificate required") != std::string::npos ||
                                reasons.find("unsupported certificate") != std::string::npos ||
                                reasons.find("decrypt error") != std::string::npos);
  if (verify != X509_V_OK)
    return make_error(errc::unauthorized, "TLS ", during, ": the peer's certificate was refused (",
                      X509_verify_cert_error_string(verify),
                      "): it is not signed by this job's CA (TROUPE_TLS_CA '", f.ca,
                      "'); give every worker a certificate the job's CA signed");
  if (reasons.find("peer did not return a certificate") != std::string::npos)
    return make_error(errc::unauthorized, "TLS ", during,
                      ": the peer presented no certificate; every worker of the job needs "
                      "TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA");
  if (peer_refused_us)
    return make_error(
        errc::unauthorized, "TLS ", during, ": the peer refused this worker's certificate (",
        reasons, "): the peer trusts another CA, or this certificate (TROUPE_TLS_CERT '", f.cert,
        "') is not signed by the job's CA; every worker needs a certificate "
        "signed by the same CA as its TROUPE_TLS_CA");
  if (reasons.find("wrong version number") != std::string::npos ||
      reasons.find("packet length too long") != std::string::npos ||
      reasons.find("record layer failure") != std::string::npos ||
      reasons.find("http request") != std::string::npos ||
      reasons.find("unsupported protocol") != std::string::npos)
    return make_error(errc::protocol_error, "TLS ", during, ": the peer does not speak TLS (",
                      reasons,
                      "); set TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA on every worker of "
                      "the job, or on none");
  return make_error(errc::protocol_error, "TLS ", during, " failed: ", reasons);
}

expected<bool> session::handshake() {
  if (established_) return true;
  ERR_clear_error();
  const int r = SSL_do_handshake(static_cast<SSL*>(ssl_));
  if (r == 1) {
    established_ = true;
    return true;
  }
  const int kind = SSL_get_error(static_cast<SSL*>(ssl_), r);
  if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) return false;
  return failure(r, "handshake");
}

expected<std::size_t> session::read(std::span<std::byte> out) {
  ERR_clear_error();
  std::size_t n = 0;
  const int r = SSL_read_ex(static_cast<SSL*>(ssl_), out.data(), out.size(), &n);
  if (r == 1) return n;
  const int kind = SSL_get_error(static_cast<SSL*>(ssl_), r);
  if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) return std::size_t{0};
  return failure(r, "read");
}

expected<void> session::write(std::span<const std::byte> plaintext) {
  ERR_clear_error();
  while (!plaintext.empty()) {
    std::size_t n = 0;
    const int r = SSL_write_ex(static_cast<SSL*>(ssl_), plaintext.data(), plaintext.size(), &n);
    if (r != 1) return failure(r, "write");
    plaintext = plaintext.subspan(n);
  }
  return ok();
}

std::size_t session::output_size() const noexcept { return io_->out.size(); }

std::size_t session::take_output(std::vector<std::byte>& out) {
  const std::size_t n = io_->out.size();
  if (out.empty()) {
    out.swap(io_->out);  // both keep their capacity: no allocation in steady state
  } else {
    out.insert(out.end(), io_->out.begin(), io_->out.end());
  }
  io_->out.clear();
  return n;
}

std::string session::describe() const {
  SSL* ssl = static_cast<SSL*>(ssl_);
  const char* cipher = SSL_get_cipher_name(ssl);
  return strcat(SSL_get_version(ssl), " ", cipher ? cipher : "no cipher");
}

}  // namespace troupe::tls
