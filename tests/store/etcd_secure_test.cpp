// etcd_store against an etcd that wants TLS, client certificates or a user: the store
// works through each, and every refusal says what was wrong and what to give.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <troupe/store/connect.hpp>
#include <troupe/store/etcd_store.hpp>
#include "support/etcd_server.hpp"
#include "support/skip.hpp"
#include "support/test_pki.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::etcd_store;
using troupe::etcd_store_options;
using troupe::test::etcd_server;
using troupe::test::etcd_server_options;
using troupe::test::test_pki;

namespace {

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string text(const troupe::bytes& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Every store call a job makes, including a wait that blocks on a watch stream.
void exercise(troupe::store& s) {
  REQUIRE(s.set("a", as_bytes("1"), 5s).has_value());
  auto got = s.get("a", 5s);
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.error().to_string()));
  CHECK(text(*got) == "1");
  auto n = s.add("count", 3, 5s);
  REQUIRE(n.has_value());
  CHECK(*n == 3);
  auto swapped = s.compare_set("a", troupe::bytes(as_bytes("1").begin(), as_bytes("1").end()),
                               as_bytes("2"), 5s);
  REQUIRE(swapped.has_value());
  CHECK(text(*swapped) == "2");
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    (void)s.set("late", as_bytes("x"), 5s);
  });
  std::vector<std::string> keys{"late"};
  auto waited = s.wait(keys, 10s);
  later.join();
  CHECK_MESSAGE(waited.has_value(), (waited ? "" : waited.error().to_string()));
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& body) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << body << "\n";
  return path;
}

struct tls_etcd {
  std::unique_ptr<test_pki> pki;
  std::unique_ptr<etcd_server> etcd;
};

// An etcd serving https that requires client certificates signed by the test CA. Null
// (with the reason in `skip`) when etcd or openssl is missing.
std::unique_ptr<tls_etcd> start_tls_etcd(std::string& skip) {
  if (!etcd_server::available()) {
    skip = etcd_server::skip_reason();
    return nullptr;
  }
  if (!test_pki::available()) {
    skip = test_pki::skip_reason();
    return nullptr;
  }
  auto out = std::make_unique<tls_etcd>();
  auto pki = test_pki::make();
  REQUIRE_MESSAGE(pki.has_value(), (pki ? "" : pki.error().to_string()));
  out->pki = std::move(*pki);
  etcd_server_options o;
  o.cert_file = out->pki->server_cert();
  o.key_file = out->pki->server_key();
  o.client_ca_file = out->pki->ca();
  auto etcd = etcd_server::start(o);
  REQUIRE_MESSAGE(etcd.has_value(), (etcd ? "" : etcd.error().to_string()));
  out->etcd = std::move(*etcd);
  return out;
}

std::string error_of(const troupe::expected<std::unique_ptr<troupe::store>>& s) {
  return s ? std::string("(connected)") : s.error().to_string();
}

troupe::store_options quick() {
  troupe::store_options so;
  so.timeout = 5s;
  so.connect_timeout = 5s;
  return so;
}

}  // namespace

TEST_CASE("an etcd store over TLS with a client certificate sets, gets, counts, swaps and waits") {
  std::string skip;
  auto t = start_tls_etcd(skip);
  if (!t) TROUPE_SKIP_TEST(skip);
  const auto& pki = *t->pki;
  // As troupe-run hands it to its workers: one URL.
  std::string url = "etcd://" + t->etcd->endpoint() + "/job-tls?protocol=https&cacert=" + pki.ca() +
                    "&cert=" + pki.client_cert() + "&key=" + pki.client_key();
  auto s = troupe::connect_store(url, quick());
  REQUIRE_MESSAGE(s.has_value(), error_of(s));
  exercise(**s);
  CHECK((*s)->describe().find("https://") != std::string::npos);

  // The same through the options, with an https:// endpoint instead of protocol=https.
  etcd_store_options o;
  o.endpoints = {t->etcd->url()};
  o.prefix = "/job-tls-2/";
  o.tls.ca_file = pki.ca();
  o.tls.cert_file = pki.client_cert();
  o.tls.key_file = pki.client_key();
  o.timeout = 5s;
  auto direct = etcd_store::connect(o);
  REQUIRE_MESSAGE(direct.has_value(), (direct ? "" : direct.error().to_string()));
  exercise(**direct);
}

TEST_CASE(
    "a TLS etcd refuses clients that lack the right CA, certificate or protocol, and says "
    "what to give") {
  std::string skip;
  auto t = start_tls_etcd(skip);
  if (!t) TROUPE_SKIP_TEST(skip);
  const auto& pki = *t->pki;
  const std::string base = "etcd://" + t->etcd->endpoint() + "/refused?";

  SUBCASE("no client certificate") {
    auto s = troupe::connect_store(base + "protocol=https&cacert=" + pki.ca(), quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(s.error().message().find("client certificate") != std::string::npos, error_of(s));
  }
  SUBCASE("a client certificate from another CA") {
    auto s = troupe::connect_store(base + "protocol=https&cacert=" + pki.ca() + "&cert=" +
                                       pki.stranger_cert() + "&key=" + pki.stranger_key(),
                                   quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(
        s.error().message().find("refused this client's certificate") != std::string::npos,
        error_of(s));
  }
  SUBCASE("a CA that did not sign etcd's certificate") {
    auto s = troupe::connect_store(base + "protocol=https&cacert=" + pki.other_ca() +
                                       "&cert=" + pki.client_cert() + "&key=" + pki.client_key(),
                                   quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(s.error().message().find("not signed by that CA") != std::string::npos,
                  error_of(s));
  }
  SUBCASE("plain http to an https etcd") {
    auto s = troupe::connect_store("etcd://" + t->etcd->endpoint() + "/refused", quick());
    REQUIRE_FALSE(s.has_value());
    CHECK_MESSAGE(s.error().message().find("serves https, write https://") != std::string::npos,
                  error_of(s));
  }
}

TEST_CASE(
    "https to a plain etcd, and TLS files that cannot be used, are refused at connect "
    "naming the cause") {
  if (!etcd_server::available()) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  if (!test_pki::available()) TROUPE_SKIP_TEST(test_pki::skip_reason());
  auto pki = test_pki::make();
  REQUIRE(pki.has_value());
  auto* plain = etcd_server::shared();
  REQUIRE(plain != nullptr);
  const std::string base = "etcd://" + plain->endpoint() + "/files?";

  SUBCASE("https to a plain etcd") {
    auto s = troupe::connect_store(base + "protocol=https&cacert=" + (*pki)->ca(), quick());
    REQUIRE_FALSE(s.has_value());
    CHECK_MESSAGE(s.error().message().find("does not speak TLS") != std::string::npos, error_of(s));
  }
  SUBCASE("a CA file that does not exist") {
    auto s = troupe::connect_store(base + "protocol=https&cacert=/nonexistent/ca.pem", quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_MESSAGE(s.error().message().find("/nonexistent/ca.pem") != std::string::npos,
                  error_of(s));
  }
  SUBCASE("a certificate without its key") {
    auto s = troupe::connect_store(base + "protocol=https&cert=" + (*pki)->client_cert(), quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_MESSAGE(s.error().message().find("needs both cert") != std::string::npos, error_of(s));
  }
  SUBCASE("a key that belongs to another certificate") {
    auto s = troupe::connect_store(
        base + "protocol=https&cert=" + (*pki)->client_cert() + "&key=" + (*pki)->stranger_key(),
        quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_MESSAGE(
        s.error().message().find("does not belong to the certificate") != std::string::npos,
        error_of(s));
  }
  SUBCASE("TLS files with a plain http endpoint") {
    auto s = troupe::connect_store(base + "cacert=" + (*pki)->ca(), quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_MESSAGE(s.error().message().find("protocol=https") != std::string::npos, error_of(s));
  }
}

TEST_CASE(
    "an etcd store signs in as an etcd user, renews a forgotten token, and a wrong "
    "password or no user is refused naming what to give") {
  if (!etcd_server::available()) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto started = etcd_server::start();
  REQUIRE_MESSAGE(started.has_value(), (started ? "" : started.error().to_string()));
  auto& etcd = **started;
  for (std::vector<std::string> step :
       {std::vector<std::string>{"user", "add", "root:root-pw"},
        {"user", "grant-role", "root", "root"},
        {"user", "add", "trainer:trainer-pw"},
        {"role", "add", "job"},
        {"role", "grant-permission", "job", "--prefix=true", "readwrite", "/secured/"},
        {"user", "grant-role", "trainer", "job"},
        {"auth", "enable"}}) {
    auto r = etcd.etcdctl(step);
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  }
  char dir_template[] = "/tmp/troupe-etcd-auth-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string good = write_file(dir, "good", "trainer-pw");
  const std::string bad = write_file(dir, "bad", "not-the-password");
  const std::string base = "etcd://" + etcd.endpoint() + "/secured/job";

  SUBCASE("the right password") {
    auto s = troupe::connect_store(base + "?user=trainer&password_file=" + good, quick());
    REQUIRE_MESSAGE(s.has_value(), error_of(s));
    exercise(**s);
  }
  SUBCASE("a wrong password") {
    auto s = troupe::connect_store(base + "?user=trainer&password_file=" + bad, quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(s.error().message().find("refused user 'trainer'") != std::string::npos,
                  error_of(s));
  }
  SUBCASE("no user") {
    auto s = troupe::connect_store(base, quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(s.error().message().find("password_file") != std::string::npos, error_of(s));
  }
  SUBCASE("a prefix the user may not touch") {
    auto s = troupe::connect_store(
        "etcd://" + etcd.endpoint() + "/elsewhere?user=trainer&" + "password_file=" + good,
        quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::unauthorized);
    CHECK_MESSAGE(s.error().message().find("lacks a role") != std::string::npos, error_of(s));
  }
  SUBCASE("a password file that is missing") {
    auto s = troupe::connect_store(base + "?user=trainer&password_file=" + dir + "/none", quick());
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_MESSAGE(s.error().message().find(dir + "/none") != std::string::npos, error_of(s));
  }
  SUBCASE("a token etcd forgot (etcd restarted) is renewed") {
    auto s = troupe::connect_store(base + "?user=trainer&password_file=" + good, quick());
    REQUIRE_MESSAGE(s.has_value(), error_of(s));
    REQUIRE((*s)->set("before", as_bytes("1"), 5s).has_value());
    etcd.stop();
    auto restarted = etcd.restart();
    REQUIRE_MESSAGE(restarted.has_value(), (restarted ? "" : restarted.error().to_string()));
    auto r = (*s)->set("after", as_bytes("2"), 10s);
    CHECK_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("an etcd store URL reads its TLS and user options, and lists them when one is unknown") {
  char dir_template[] = "/tmp/troupe-etcd-url-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string pw = write_file(dir, "pw", "s3cret");
  auto o = troupe::parse_etcd_store_url(
      "etcd://h:2379/job?protocol=https&cacert=/a%20b/ca.pem&"
      "cert=/c.pem&key=/c.key&user=trainer&password_file=" +
      pw);
  REQUIRE_MESSAGE(o.has_value(), (o ? "" : o.error().to_string()));
  CHECK(o->tls.enabled);
  CHECK(o->tls.ca_file == "/a b/ca.pem");
  CHECK(o->tls.cert_file == "/c.pem");
  CHECK(o->tls.key_file == "/c.key");
  CHECK(o->user == "trainer");
  CHECK(o->password == "s3cret");

  auto unknown = troupe::parse_etcd_store_url("etcd://h:2379/job?password=s3cret");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.error().message().find("password_file=PATH") != std::string::npos);
  auto no_file = troupe::parse_etcd_store_url("etcd://h:2379/job?user=trainer");
  REQUIRE_FALSE(no_file.has_value());
  CHECK(no_file.error().message().find("needs password_file") != std::string::npos);
  auto https = troupe::parse_etcd_store_url("etcd://https://h:2379/job");
  CHECK_FALSE(https.has_value());  // the scheme belongs in protocol=https
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}
