#include "support/test_pki.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace troupe::test {

namespace {

constexpr const char* openssl_binary = "/usr/bin/openssl";

// Runs one openssl command in `dir`; its output is returned in the error when it fails.
expected<void> openssl(const std::string& dir, const std::string& args) {
  std::string command = "cd '" + dir + "' && '" + openssl_binary + "' " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return make_error(errc::unavailable, "cannot run openssl ", args);
  std::string output;
  char buf[512];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  if (::pclose(pipe) != 0)
    return make_error(errc::unavailable, "openssl ", args, " failed: ", output);
  return {};
}

const std::string new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

// A CA: <name>.pem and <name>.key.
expected<void> make_ca(const std::string& dir, const std::string& name) {
  return openssl(dir, "req -x509 " + new_key + " -keyout " + name + ".key -out " + name +
                          ".pem -days 2 -subj /CN=" + name);
}

// A certificate <name>.pem (key <name>.key) signed by <ca>, with the extensions in <ext>.
expected<void> make_cert(const std::string& dir, const std::string& name, const std::string& ca,
                         const std::string& subject, const std::string& ext) {
  {
    std::ofstream out(dir + "/" + name + ".cnf");
    out << ext << "\n";
  }
  if (auto r = openssl(dir, "req " + new_key + " -keyout " + name + ".key -out " + name +
                                ".csr -subj /CN=" + subject);
      !r)
    return r;
  return openssl(dir, "x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca +
                          ".key -CAcreateserial -out " + name + ".pem -days 2 -extfile " + name +
                          ".cnf");
}

}  // namespace

bool test_pki::available() { return ::access(openssl_binary, X_OK) == 0; }

std::string test_pki::skip_reason() {
  return std::string("the openssl command is not installed (no ") + openssl_binary +
         "); run the project's install script (it installs Debian's openssl)";
}

expected<std::unique_ptr<test_pki>> test_pki::make() {
  if (!available()) return make_error(errc::unavailable, skip_reason());
  char dir_template[] = "/tmp/troupe-pki-XXXXXX";
  if (!::mkdtemp(dir_template))
    return make_error(errc::unavailable, "cannot create a directory under /tmp");
  std::unique_ptr<test_pki> p(new test_pki());
  p->dir_ = dir_template;
  const std::string server_ext =
      "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth";
  const std::string client_ext = "extendedKeyUsage=clientAuth";
  const std::string& d = p->dir_;
  if (auto r = make_ca(d, "ca"); !r) return std::move(r).error();
  if (auto r = make_ca(d, "other-ca"); !r) return std::move(r).error();
  if (auto r = make_cert(d, "server", "ca", "127.0.0.1", server_ext); !r)
    return std::move(r).error();
  if (auto r = make_cert(d, "client", "ca", "trainer", client_ext); !r) return std::move(r).error();
  if (auto r = make_cert(d, "stranger", "other-ca", "stranger", client_ext); !r)
    return std::move(r).error();
  if (auto r = make_cert(d, "other-node", "other-ca", "127.0.0.1", server_ext); !r)
    return std::move(r).error();
  return p;
}

test_pki::~test_pki() {
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

}  // namespace troupe::test
