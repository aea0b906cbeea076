// Workers on one host reach each other through local (Unix domain) sockets, and over TCP
// when either side turns them off; the calls are the same either way.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "group_fixture.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;
using namespace std::chrono_literals;

namespace {

// This process's Unix sockets named "@troupe-rpc/...": listening ones and connected ones
// (an accepted connection carries its listener's name).
struct local_sockets {
  int listening = 0;
  int connected = 0;
};

// The inodes of this process's sockets (other tests may run beside this one).
std::set<std::string> own_socket_inodes() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) out.insert(target.substr(8, target.size() - 9));
  }
  return out;
}

local_sockets count_local_sockets() {
  local_sockets n;
  auto own = own_socket_inodes();
  std::ifstream in("/proc/net/unix");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.find("@troupe-rpc/") == std::string::npos) continue;
    // Num RefCount Protocol Flags Type St Inode Path: St 01 unconnected, 03 connected.
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, state, inode;
    f >> num >> refs >> proto >> flags >> type >> state >> inode;
    if (!own.contains(inode)) continue;
    if (state == "01") ++n.listening;
    if (state == "03") ++n.connected;
  }
  return n;
}

void check_calls(std::vector<std::unique_ptr<agent>>& g) {
  auto a = g[0]->rpc_sync<int>("w1", "add", 2, 3);
  REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
  CHECK(*a == 5);
  auto b = g[1]->rpc_sync<int>("w0", "add", 4, 5);
  REQUIRE_MESSAGE(b, (b ? "" : b.error().to_string()));
  CHECK(*b == 9);
}

}  // namespace

TEST_CASE("workers listening on loopback reach each other through their local sockets") {
  auto g = make_group(2);
  check_calls(g);
  auto n = count_local_sockets();
  CHECK(n.listening == 2);
  // Accepted connections carry their listener's name: each worker's connection to the
  // other and to itself.
  CHECK(n.connected == 4);
  shutdown_all(g);
}

TEST_CASE("a worker that turns local sockets off is reached over TCP, in both directions") {
  auto g = make_group(2, std::make_shared<memory_store>(), [](int rank, rpc_backend_options& o) {
    if (rank == 1) o.local_socket = false;
  });
  check_calls(g);
  auto n = count_local_sockets();
  CHECK(n.listening == 1);  // w0's only
  // Only w0's connection to itself: w1 never dials a local socket, and w0 finds none at w1.
  CHECK(n.connected == 1);
  shutdown_all(g);
}

TEST_CASE("the tcp backend's local_socket setting takes 0 or 1 and nothing else") {
  auto off = construct_rpc_backend_options("tcp", 10s, "", {{"local_socket", "0"}});
  REQUIRE(off);
  CHECK_FALSE(off->local_socket);
  auto on = construct_rpc_backend_options("tcp", 10s, "", {{"local_socket", "1"}});
  REQUIRE(on);
  CHECK(on->local_socket);
  auto bad = construct_rpc_backend_options("tcp", 10s, "", {{"local_socket", "yes"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("local_socket") != std::string::npos);
}
