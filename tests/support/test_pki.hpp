// test_pki: a throwaway certificate authority for TLS tests, made with the openssl command
// (Debian's openssl package) in a fresh directory under /tmp, removed on destruction.
//
// It holds a CA, a server certificate for 127.0.0.1 and localhost, a client certificate
// signed by the CA, and a second CA with a client certificate and a certificate for both
// roles of its own, which a peer trusting only the first CA must refuse. All keys are P-256, all
// files PEM.
#pragma once

#include <memory>
#include <string>

#include <troupe/core/expected.hpp>

namespace troupe::test {

class test_pki {
 public:
  /// Whether the openssl command is installed.
  static bool available();
  /// Why TLS tests are skipped when !available().
  static std::string skip_reason();
  /// Makes every file; fails naming the openssl step that failed, with its output.
  static expected<std::unique_ptr<test_pki>> make();

  ~test_pki();
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  std::string ca() const { return dir_ + "/ca.pem"; }
  std::string server_cert() const { return dir_ + "/server.pem"; }
  std::string server_key() const { return dir_ + "/server.key"; }
  std::string client_cert() const { return dir_ + "/client.pem"; }
  std::string client_key() const { return dir_ + "/client.key"; }
  /// The second CA, and a client certificate it signed.
  std::string other_ca() const { return dir_ + "/other-ca.pem"; }
  std::string stranger_cert() const { return dir_ + "/stranger.pem"; }
  std::string stranger_key() const { return dir_ + "/stranger.key"; }
  /// A certificate the second CA signed for both roles (server and client), like server().
  std::string other_node_cert() const { return dir_ + "/other-node.pem"; }
  std::string other_node_key() const { return dir_ + "/other-node.key"; }

 private:
  test_pki() = default;
  std::string dir_;
};

}  // namespace troupe::test
