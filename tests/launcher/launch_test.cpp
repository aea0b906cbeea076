// troupe::launch: a function run in N forked children.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include <troupe/launcher/launch.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/rendezvous.hpp>
#include "process_helpers.hpp"

using namespace std::chrono_literals;

namespace {

troupe::launch_config procs(int n) {
  troupe::launch_config c;
  c.nprocs = n;
  c.stop_grace = 2s;
  return c;
}

}  // namespace

TEST_CASE("launch runs the function in N children, each with its own rank") {
  auto dir = launcher_test::fresh_dir("launch");
  auto r = troupe::launch(
      [&] {
        std::ofstream(dir / (std::string("rank") + std::getenv("RANK")))
            << std::getenv("WORLD_SIZE") << ' ' << std::getenv("LOCAL_RANK") << ' '
            << std::getenv("MASTER_PORT");
      },
      procs(3));
  REQUIRE_MESSAGE(r, r.error().to_string());
  std::set<std::string> ports;
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(dir / ("rank" + std::to_string(i)));
    int world = 0;
    int local = -1;
    std::string port;
    in >> world >> local >> port;
    CHECK(world == 3);
    CHECK(local == i);
    ports.insert(port);
  }
  CHECK(ports.size() == 1);
}

TEST_CASE("launched children meet through the store named in their environment") {
  auto r = troupe::launch(
      []() -> troupe::expected<void> {
        auto s = troupe::connect_store(std::getenv("TROUPE_STORE_URL"));
        if (!s) return std::move(s).error();
        const int rank = std::atoi(std::getenv("RANK"));
        const int world = std::atoi(std::getenv("WORLD_SIZE"));
        return troupe::barrier(**s, "start", rank, world, 10s);
      },
      procs(4));
  CHECK_MESSAGE(r, r.error().to_string());
}

TEST_CASE("the first child's error reaches the caller with its message") {
  auto r = troupe::launch(
      []() -> troupe::expected<void> {
        if (std::string(std::getenv("RANK")) == "2")
          return troupe::make_error(troupe::errc::invalid_argument, "rank two is unhappy");
        return troupe::ok();
      },
      procs(3));
  REQUIRE(!r);
  CHECK(r.error().code() == troupe::errc::user_error);
  CHECK(r.error().message().find("rank 2 failed") != std::string::npos);
  CHECK(r.error().message().find("rank two is unhappy") != std::string::npos);
}

TEST_CASE("an exception in a child is reported, and the other children are stopped") {
  auto r = troupe::launch(
      [] {
        if (std::string(std::getenv("RANK")) == "0") throw std::runtime_error("bad input file");
        pause();  // the others wait to be stopped
      },
      procs(2));
  REQUIRE(!r);
  INFO(r.error().to_string());
  CHECK(r.error().message().find("rank 0 failed: bad input file") != std::string::npos);
}

TEST_CASE("a child killed by a signal is reported with the signal") {
  auto r = troupe::launch(
      [] {
        if (std::string(std::getenv("RANK")) == "1") std::abort();
      },
      procs(2));
  REQUIRE(!r);
  CHECK(r.error().message().find("rank 1 was killed by signal 6") != std::string::npos);
}

TEST_CASE("one process runs in the caller with the environment set for the call") {
  ::unsetenv("WORLD_SIZE");
  const pid_t me = ::getpid();
  pid_t seen = -1;
  std::string world;
  auto r = troupe::launch([&] {
    seen = ::getpid();
    world = std::getenv("WORLD_SIZE");
  });
  REQUIRE(r);
  CHECK(seen == me);
  CHECK(world == "1");
  CHECK(std::getenv("WORLD_SIZE") == nullptr);
  auto bad = troupe::launch([] { throw std::runtime_error("nope"); });
  REQUIRE(!bad);
  CHECK(bad.error().message().find("nope") != std::string::npos);
}
