// Mutual TLS between real worker processes over TCP on 127.0.0.1 (local sockets off): a
// child worker gets its TLS files from TROUPE_TLS_*, as troupe-run's workers would.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/rpc/detail/agent_core.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "collectives/spawn.hpp"
#include "support/skip.hpp"
#include "support/test_pki.hpp"

using namespace troupe;
using namespace troupe::rpc;
using troupe::collectives::testing::exited_zero;
using troupe::collectives::testing::start_process;
using troupe::collectives::testing::wait_children;

namespace {

const std::string tls_worker_bin = TROUPE_RPC_TEST_WORKER;

const test::test_pki* pki() {
  static auto made = test::test_pki::make();
  return made ? made->get() : nullptr;
}

// Spawns rpc_test_worker over TCP only, with the job's TLS files in its environment.
pid_t spawn_tls_worker(const std::string& mode, const std::string& url, const std::string& name,
                       int rank, const std::string& world) {
  ::setenv("RPC_TEST_TCP_ONLY", "1", 1);
  ::setenv("TROUPE_TLS_CERT", pki()->server_cert().c_str(), 1);
  ::setenv("TROUPE_TLS_KEY", pki()->server_key().c_str(), 1);
  ::setenv("TROUPE_TLS_CA", pki()->ca().c_str(), 1);
  pid_t p = start_process({tls_worker_bin, mode, url, name, std::to_string(rank), world});
  for (const char* v : {"RPC_TEST_TCP_ONLY", "TROUPE_TLS_CERT", "TROUPE_TLS_KEY", "TROUPE_TLS_CA"})
    ::unsetenv(v);
  REQUIRE(p > 0);
  return p;
}

rpc_backend_options tls_driver_options(const std::string& url) {
  rpc_backend_options o;
  o.init_method = url;
  o.rpc_timeout = std::chrono::seconds(20);
  o.init_timeout = std::chrono::seconds(20);
  o.shutdown_timeout = std::chrono::seconds(5);
  o.device_count = 0;
  o.local_socket = false;
  o.tls = tls::config{pki()->server_cert(), pki()->server_key(), pki()->ca()};
  return o;
}

std::uint16_t port_of(const std::string& url, int rank) {
  auto s = connect_store(url);
  REQUIRE(s);
  auto rec = (*s)->get(strcat("troupe/rpc/static/", rank), std::chrono::seconds(20));
  REQUIRE(rec);
  auto m = rpc::detail::decode_member(*rec);
  REQUIRE(m);
  return m->port;
}

}  // namespace

TEST_CASE(
    "two worker processes over TCP with TLS make sync, async and one-way calls and echo 16 MiB") {
  if (!test::test_pki::available()) TROUPE_SKIP_TEST(test::test_pki::skip_reason());
  REQUIRE(pki());
  auto store = tcp_store_server::start({});
  REQUIRE(store);
  auto url = (*store)->url();
  pid_t child = spawn_tls_worker("serve_static", url, "w1", 1, "2");
  auto driver = init_rpc("w0", 0, 2, tls_driver_options(url));
  REQUIRE_MESSAGE(driver, (driver ? "" : driver.error().to_string()));
  auto& d = **driver;
  CHECK(*d.rpc_sync<int>("w1", "add", 20, 22) == 42);
  CHECK(*d.rpc_sync<std::string>("w1", "whoami") == "w0");
  std::vector<future<int>> fs;
  for (int i = 0; i < 64; ++i) fs.push_back(d.rpc_async<int>("w1", "add", i, 1));
  auto got = when_all(std::move(fs)).get(std::chrono::seconds(20));
  REQUIRE_MESSAGE(got, (got ? "" : got.error().to_string()));
  for (int i = 0; i < 64; ++i) CHECK((*got)[static_cast<std::size_t>(i)] == i + 1);
  for (int i = 1; i <= 100; ++i) CHECK(d.notify("w1", "tell", i).get(std::chrono::seconds(10)));
  long sum = 0;
  for (auto until = deadline::after(std::chrono::seconds(10)); !until.expired();) {
    sum = d.rpc_sync<long>("w1", "told").value_or(-1);
    if (sum == 5050) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(sum == 5050);
  std::vector<float> v(std::size_t{4} << 20);  // 16 MiB
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 65521);
  auto big = tensor::from<float>(v, dtype::float32);
  for (int round = 0; round < 3; ++round) {
    auto back = d.rpc_sync<tensor>("w1", "echo", big);
    REQUIRE_MESSAGE(back, (back ? "" : back.error().to_string()));
    CHECK(same_values(*back, big));
  }
  auto s = connect_store(url);
  REQUIRE(s);
  REQUIRE((*s)->set("stop", std::string("1")));
  CHECK(d.shutdown());  // meets the child at the shutdown barrier
  auto st = wait_children({child}, std::chrono::seconds(30));
  CHECK(exited_zero(st[child]));
}

TEST_CASE(
    "a TLS worker process refuses a plain caller with an error that says to set TROUPE_TLS_*") {
  if (!test::test_pki::available()) TROUPE_SKIP_TEST(test::test_pki::skip_reason());
  REQUIRE(pki());
  auto store = tcp_store_server::start({});
  REQUIRE(store);
  auto url = (*store)->url();
  pid_t child = spawn_tls_worker("serve_static", url, "w0", 0, "1");
  auto port = port_of(url, 0);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  wire::frame_builder hs(wire::kind::handshake, 0);
  std::uint32_t protocol = wire::version;
  REQUIRE(serialize(hs.message(), nullptr, protocol, std::string(16, 'n'), worker_info{"plain", 5},
                    std::string("troupe/rpc")));
  REQUIRE(hs.finish());
  REQUIRE(::send(fd, hs.head().data(), hs.head().size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(hs.head().size()));
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    answer.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  INFO(answer);
  CHECK(answer.find("requires TLS") != std::string::npos);
  CHECK(answer.find("TROUPE_TLS_CERT") != std::string::npos);
  auto s = connect_store(url);
  REQUIRE(s);
  REQUIRE((*s)->set("stop", std::string("1")));
  auto st = wait_children({child}, std::chrono::seconds(30));
  CHECK(exited_zero(st[child]));
}
