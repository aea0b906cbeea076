// child_process itself: a forked function and a program fed through a pipe.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "support/child_process.hpp"

using namespace std::chrono_literals;
using troupe::test::child_process;

TEST_CASE("a forked function's return value is its child's exit code") {
  auto p = child_process::start_forked([] { return 7; });
  REQUIRE_MESSAGE(p.started(), p.start_error());
  CHECK(p.wait(10s));
  CHECK(p.exit_code() == 7);
}

TEST_CASE("a forked function that throws ends its child with exit code 127") {
  auto p = child_process::start_forked([]() -> int { throw std::runtime_error("no"); });
  REQUIRE_MESSAGE(p.started(), p.start_error());
  CHECK(p.wait(10s));
  CHECK(p.exit_code() == 127);
}

TEST_CASE("a forked function still running at the deadline is killed and reaped") {
  auto p = child_process::start_forked([] {
    for (;;) ::pause();
    return 0;
  });
  REQUIRE_MESSAGE(p.started(), p.start_error());
  CHECK_FALSE(p.wait(50ms));
  CHECK(p.term_signal() == SIGKILL);
  CHECK(p.exited());
}

TEST_CASE("a program reads its stdin from the descriptor given as stdin_fd") {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  auto p = child_process::start({"/bin/sh", "-c", "read x; exit $x"}, {.stdin_fd = fds[0]});
  ::close(fds[0]);
  REQUIRE_MESSAGE(p.started(), p.start_error());
  const std::string line = "5\n";
  CHECK(::write(fds[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  ::close(fds[1]);
  CHECK(p.wait(10s));
  CHECK(p.exit_code() == 5);
}
