// open_cluster_store: the job's store from a launcher's environment, hosted by rank 0 when
// no launcher hosts one, scoped to the attempt, and clear errors when it cannot be had.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include <troupe/store/cluster_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// A port that was free a moment ago on 127.0.0.1.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

cluster_env torchrun_rank(int rank, int port, const std::string& master = "127.0.0.1") {
  std::map<std::string, std::string> v{{"TORCHELASTIC_RUN_ID", "job"},
                                       {"RANK", std::to_string(rank)},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", master},
                                       {"MASTER_PORT", std::to_string(port)}};
  return detect_cluster_env(v).value();
}

bool mentions(const error& e, std::string_view text) {
  return e.message().find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("rank 0 hosts the store at MASTER_ADDR:MASTER_PORT and every rank meets there, scoped") {
  const int port = free_port();
  auto host = open_cluster_store(torchrun_rank(0, port), 20s);
  REQUIRE_MESSAGE(host, host.error().to_string());
  CHECK(host->hosted);
  CHECK(host->scope == "torchrun/job/attempt-0");
  auto other = open_cluster_store(torchrun_rank(1, port), 20s);
  REQUIRE_MESSAGE(other, other.error().to_string());
  CHECK_FALSE(other->hosted);
  REQUIRE(host->scoped->set("k", "v"));
  CHECK(other->scoped->get_string("k", 5s).value() == "v");
  CHECK(other->base->get_string("torchrun/job/attempt-0/k", 5s).value() == "v");
}

TEST_CASE("a world of one with no store named gets an in-process store") {
  auto e = detect_cluster_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).value();
  auto s = open_cluster_store(e, 5s);
  REQUIRE_MESSAGE(s, s.error().to_string());
  CHECK(s->url == "memory://");
  CHECK(s->scoped->set("k", "v"));
}

TEST_CASE("no store within the timeout is an error saying where it looked and who hosts it") {
  const int port = free_port();
  auto t0 = clock::now();
  auto s = open_cluster_store(torchrun_rank(1, port), 1s);
  auto took = clock::now() - t0;
  REQUIRE_FALSE(s);
  INFO(s.error().to_string());
  CHECK(s.error().code() == errc::timeout);
  CHECK(mentions(s.error(), "no store at 127.0.0.1:" + std::to_string(port) + " after 1s"));
  CHECK(mentions(s.error(), "rank 0 hosts it under torchrun-style launch"));
  CHECK(mentions(s.error(), "is MASTER_ADDR its address"));
  CHECK(took < 30s);  // bounded by the timeout (generously: the machine may be loaded)
}

TEST_CASE("a MASTER_ADDR that does not resolve fails at once, naming it") {
  auto t0 = clock::now();
  auto s = open_cluster_store(torchrun_rank(1, 29500, "no-such-host.invalid"), 60s);
  REQUIRE_FALSE(s);
  INFO(s.error().to_string());
  CHECK(s.error().code() == errc::invalid_argument);
  CHECK(mentions(s.error(), "MASTER_ADDR='no-such-host.invalid' does not resolve"));
  CHECK(clock::now() - t0 < 30s);  // not the 60 s timeout
}

TEST_CASE("a loopback MASTER_ADDR in a job spread over hosts is refused, naming it") {
  std::map<std::string, std::string> v{{"RANK", "1"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "localhost"},
                                       {"MASTER_PORT", "29500"}};
  auto s = open_cluster_store(detect_cluster_env(v).value(), 60s);
  REQUIRE_FALSE(s);
  INFO(s.error().to_string());
  CHECK(s.error().code() == errc::invalid_argument);
  CHECK(mentions(s.error(), "MASTER_ADDR='localhost' is loopback"));
  CHECK(mentions(s.error(), "TROUPE_LOCAL_ADDR=127.0.0.1"));
  // Nodes simulated on one host say so, and then meet on loopback (here: nobody hosts).
  v["MASTER_PORT"] = std::to_string(free_port());
  const char* before = std::getenv("TROUPE_LOCAL_ADDR");
  const std::string saved = before ? before : "";
  ::setenv("TROUPE_LOCAL_ADDR", "127.0.0.1", 1);
  s = open_cluster_store(detect_cluster_env(v).value(), 1s);
  if (before)
    ::setenv("TROUPE_LOCAL_ADDR", saved.c_str(), 1);
  else
    ::unsetenv("TROUPE_LOCAL_ADDR");
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::timeout);
}

TEST_CASE("rank 0 that cannot bind MASTER_PORT says so and names the port") {
  auto taken = tcp_store_server::start({}).value();
  auto s = open_cluster_store(torchrun_rank(0, taken->port()), 5s);
  REQUIRE_FALSE(s);
  INFO(s.error().to_string());
  CHECK(mentions(s.error(), "rank 0 cannot host the job's store"));
  CHECK(mentions(s.error(), "MASTER_PORT"));
}
