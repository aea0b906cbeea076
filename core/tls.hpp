// tls: mutual TLS over memory buffers (OpenSSL's libssl with two buffer BIOs), for
// connections that own their socket and their threads: the caller moves ciphertext between
// the session and the socket, so the TLS layer never touches a descriptor and never blocks.
// The RPC agent's TCP connections use it (docs/security.md, "TLS between hosts").
//
// Both sides present a certificate signed by the job's CA and verify the peer's against
// that CA; the peer's host name or address is not checked (every certificate the job's CA
// signed is a member of the job). TLS 1.3 (1.2 accepted) with AES-GCM only.
//
// Threading: a context is immutable once made and may be shared; a session is not thread
// safe: its owner serializes every call (the RPC connection holds a small mutex around each).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe::tls {

/// A process's TLS identity: PEM files.
struct config {
  /// This process's certificate (with its chain, if any), signed by the job's CA.
  std::string cert;
  /// The certificate's private key, unencrypted.
  std::string key;
  /// The job's CA: peers must present a certificate it signed.
  std::string ca;
  /// Whether any file is named (then all three must be).
  bool enabled() const noexcept { return !cert.empty() || !key.empty() || !ca.empty(); }
};

/// How messages name the three files (the settings that give them).
struct setting_names {
  /// The name of the certificate's setting.
  std::string_view cert = "TROUPE_TLS_CERT";
  /// The name of the key's setting.
  std::string_view key = "TROUPE_TLS_KEY";
  /// The name of the CA's setting.
  std::string_view ca = "TROUPE_TLS_CA";
};

/// An SSL_CTX with the job's identity and CA loaded.
class context {
 public:
  /// Loads and checks the files. Fails with errc::invalid_argument naming the setting and
  /// the file that is missing, unreadable, not PEM, or whose key does not match the
  /// certificate.
  static expected<std::shared_ptr<const context>> make(const config& c, setting_names names = {});
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  /// The files it was made from.
  const config& files() const noexcept { return files_; }
  /// The OpenSSL context (an SSL_CTX*), for sessions.
  void* native() const noexcept { return ctx_; }

 private:
  context() = default;
  void* ctx_ = nullptr;
  config files_;
};

/// One connection's TLS state. Ciphertext received goes in with put_input(); what the
/// session has to send (handshake records, alerts, encrypted data) comes out of
/// take_output(), in order. Not thread safe.
class session {
 public:
  /// `client`: this side opened the connection (it starts the handshake).
  static expected<std::unique_ptr<session>> make(std::shared_ptr<const context> ctx, bool client);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Hands received ciphertext to the session.
  void put_input(std::span<const std::byte> ciphertext);
  /// Advances the handshake with the input so far: true once it is complete (the peer's
  /// certificate verified), false while it needs more input. Fails with errc::unauthorized
  /// (a certificate refused, by either side) or errc::protocol_error (the peer does not
  /// speak TLS), the message saying which side refused what and what to fix.
  expected<bool> handshake();
  /// Whether the handshake completed.
  bool established() const noexcept { return established_; }
  /// Decrypts into `out`: the bytes read, 0 when no whole record is buffered yet. Fails
  /// with errc::connection_lost when the peer closed the session, or as handshake() does.
  expected<std::size_t> read(std::span<std::byte> out);
  /// Encrypts all of `plaintext` into the output (the handshake must be complete).
  expected<void> write(std::span<const std::byte> plaintext);
  /// Bytes of output waiting to be taken.
  std::size_t output_size() const noexcept;
  /// Appends the output to `out` (by swapping buffers when `out` is empty); returns how
  /// many bytes.
  std::size_t take_output(std::vector<std::byte>& out);
  /// The negotiated protocol and cipher, e.g. "TLSv1.3 TLS_AES_128_GCM_SHA256".
  std::string describe() const;

 private:
  session() = default;
  error failure(int ret, std::string_view during);
  std::shared_ptr<const context> ctx_;
  void* ssl_ = nullptr;  // SSL*
  // What the SSL's two BIOs read and write: plain byte vectors, so that ciphertext is
  // copied once each way and handed out by swapping buffers (OpenSSL's memory BIOs zero
  // every byte they grow by and need one more copy out).
  struct buffers {
    std::vector<std::byte> in;  // ciphertext received; the SSL has read up to in_pos
    std::size_t in_pos = 0;
    std::vector<std::byte> out;  // ciphertext the SSL wrote, to send
  };
  std::unique_ptr<buffers> io_ = std::make_unique<buffers>();
  bool client_ = false;
  bool established_ = false;
};

}  // namespace troupe::tls
