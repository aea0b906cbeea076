// Real processes meeting through a TCP store on 127.0.0.1: rendezvous of 16, a token
// holder killed with SIGKILL, and the troupe-store binary.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::errc;

// Starts `args` as a child process; stdout goes to `stdout_fd` when >= 0.
pid_t spawn(const std::vector<std::string>& args, int stdout_fd = -1) {
  std::string why;
  pid_t pid = troupe::test::spawn_process(args, {.stdout_fd = stdout_fd}, &why);
  REQUIRE_MESSAGE(pid > 0, why);
  return pid;
}

// Waits for every child up to `timeout`; kills the stragglers. Returns pid -> wait status
// (-1 for a child that had to be killed).
std::map<pid_t, int> wait_all(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  return troupe::test::wait_processes(pids, timeout);
}

using troupe::test::exited_zero;

std::unique_ptr<troupe::store> open(const std::string& url) {
  troupe::store_options o;
  o.connect_timeout = 5s;
  o.timeout = 20s;
  auto s = troupe::connect_store(url, o);
  REQUIRE(s.has_value());
  return std::move(*s);
}

// Reads one line from fd, waiting at most `timeout` for it.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (::poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 1))) <= 0) break;
    char c = 0;
    if (::read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

// Runs troupe-store on port 0 and returns its pid and "host:port".
std::pair<pid_t, std::string> start_store_binary() {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = spawn({TROUPE_STORE_BINARY, "--port", "0"}, fds[1]);
  ::close(fds[1]);
  std::string line = read_line(fds[0], 10s);
  ::close(fds[0]);
  REQUIRE_MESSAGE(line.rfind("listening on 127.0.0.1:", 0) == 0, "got '", line, "'");
  return {pid, line.substr(std::string("listening on ").size())};
}

}  // namespace

TEST_CASE("sixteen processes rendezvous through a tcp store and all see every name") {
  auto server = troupe::tcp_store_server::start({}).value();
  constexpr int world = 16;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r)
    pids.push_back(spawn({TROUPE_STORE_TEST_WORKER, "gather", server->url(), std::to_string(r),
                          std::to_string(world)}));
  auto status = wait_all(pids, 60s);
  for (pid_t p : pids) {
    CAPTURE(p);
    CHECK(exited_zero(status[p]));
  }
  auto s = open(server->url());
  CHECK(s->add("saw-all", 0).value() == world);
}

TEST_CASE("a token held by a process killed with SIGKILL passes to a waiting process") {
  auto server = troupe::tcp_store_server::start({}).value();
  auto s = open(server->url());
  pid_t holder = spawn({TROUPE_STORE_TEST_WORKER, "hold-token", server->url()});
  auto holding = s->get("doomed/holding", 20s);
  if (!holding) wait_all({holder}, 1ms);
  REQUIRE(holding.has_value());
  pid_t taker = spawn({TROUPE_STORE_TEST_WORKER, "take-token", server->url()});
  auto waiting = s->get("taker/waiting", 20s);
  REQUIRE(waiting.has_value());
  REQUIRE(::kill(holder, SIGKILL) == 0);
  auto killed = wait_all({holder}, 10s);
  CHECK(WIFSIGNALED(killed[holder]));
  auto taken = wait_all({taker}, 20s);
  CHECK(exited_zero(taken[taker]));
  auto record = s->get_string("taker/acquired", 5s);
  REQUIRE(record.has_value());
  CHECK(record->find("taker") != std::string::npos);
}

TEST_CASE("the troupe-store binary prints its address and exits cleanly on SIGTERM") {
  auto [pid, address] = start_store_binary();
  {
    auto s = open("tcp://" + address);
    REQUIRE(s->set("k", std::string_view("v")));
    CHECK(s->get_string("k", 5s).value() == "v");
  }
  REQUIRE(::kill(pid, SIGTERM) == 0);
  auto st = wait_all({pid}, 10s);
  CHECK(exited_zero(st[pid]));
}

TEST_CASE("a client blocked in get fails with connection_lost when the store process dies") {
  auto [pid, address] = start_store_binary();
  auto s = open("tcp://" + address);
  REQUIRE(s->set("k", std::string_view("v")));
  troupe::expected<troupe::bytes> got = troupe::make_error(errc::internal, "not run");
  auto start = std::chrono::steady_clock::now();
  std::thread blocked([&] { got = s->get("never-written", 30s); });
  REQUIRE(::kill(pid, SIGKILL) == 0);
  blocked.join();
  wait_all({pid}, 10s);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  REQUIRE_FALSE(got.has_value());
  CHECK(got.error().code() == errc::connection_lost);
}
