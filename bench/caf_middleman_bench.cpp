// The anchor for the actors benchmark: CAF 0.17's own middleman (publish / remote_actor)
// between two processes on 127.0.0.1, with one user message type.
//
//   caf_middleman_bench [--scheduler sharing|stealing] [--rounds N] [--messages N]
//                       [--payload BYTES] [--json]
//
// Figures: request round trip p50/p99 (a request of `bench_message` answered with the same
// message, one at a time) and one-way throughput (N messages sent without waiting, then one
// request whose answer says how many arrived; per-sender order makes that the end mark).
// The process re-executes itself as the server ("--serve"), which publishes its actor on a
// port chosen by the OS and prints it on stdout.
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actor_bench_common.hpp"
#include "support/child_process.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

namespace {

using troupe::bench::bench_message;
using troupe::bench::server_actor;

using options = troupe::bench::bench_options;

void configure(caf::actor_system_config& cfg, const options& o) {
  cfg.load<caf::io::middleman>();
  cfg.add_message_type<bench_message>("bench_message");
  // A string value is silently ignored by CAF 0.17: the policy must be an atom.
  cfg.set("scheduler.policy",
          o.scheduler == "sharing" ? caf::atom("sharing") : caf::atom("stealing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

int serve(const options& o) {
  caf::actor_system_config cfg;
  configure(cfg, o);
  caf::actor_system sys{cfg};
  auto a = sys.spawn(server_actor);
  auto port = sys.middleman().publish(a, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "publish failed: %s\n", sys.render(port.error()).c_str());
    return 1;
  }
  std::printf("%u\n", static_cast<unsigned>(*port));
  std::fflush(stdout);
  // Serve until the client closes our stdin.
  char buf[64];
  while (::read(0, buf, sizeof buf) > 0) {
  }
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o = troupe::bench::parse_options(argc, argv, "caf_middleman_bench", true);
  if (!o.serve.empty()) return serve(o);

  // Start the server: ourselves with --serve, stdin and stdout through pipes.
  // The pipes are close-on-exec: the server holds only the ends it was given.
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    std::perror("pipe");
    return 1;
  }
  auto server = troupe::test::child_process::start(
      {"/proc/self/exe", "--serve", "stdout", "--scheduler", o.scheduler},
      {.stdout_fd = from_child[1], .stdin_fd = to_child[0]});
  if (!server.started()) {
    std::fprintf(stderr, "could not start the server process: %s\n", server.start_error().c_str());
    return 1;
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  char line[32] = {};
  ssize_t got = ::read(from_child[0], line, sizeof line - 1);
  if (got <= 0) {
    std::fprintf(stderr, "the server process did not report its port\n");
    return 1;
  }
  auto port = static_cast<uint16_t>(std::atoi(line));

  int rc = 0;
  {
    caf::actor_system_config cfg;
    configure(cfg, o);
    caf::actor_system sys{cfg};
    auto remote = sys.middleman().remote_actor("127.0.0.1", port);
    if (!remote) {
      std::fprintf(stderr, "remote_actor failed: %s\n", sys.render(remote.error()).c_str());
      return 1;  // the handle kills the server
    }
    auto figures = troupe::bench::measure(sys, *remote, o.rounds, o.messages, o.payload);
    if (!figures) rc = 1;
    if (rc == 0) {
      double p50 = figures->rtt_p50_us, p99 = figures->rtt_p99_us,
             rate = figures->oneway_msgs_per_s;
      if (o.json) {
        std::printf(
            "{\"impl\": \"caf-middleman-%s\", \"bench\": \"actors\", \"payload\": %zu, "
            "\"rtt_p50_us\": %.2f, \"rtt_p99_us\": %.2f, \"oneway_msgs_per_s\": %.1f}\n",
            o.scheduler.c_str(), o.payload, p50, p99, rate);
      } else {
        std::printf(
            "# caf_middleman_bench --scheduler %s --rounds %d --messages %d --payload %zu\n",
            o.scheduler.c_str(), o.rounds, o.messages, o.payload);
        std::printf("request round trip: p50 %.1f us, p99 %.1f us (%d rounds)\n", p50, p99,
                    o.rounds);
        std::printf("one-way throughput: %.0f msgs/s (%d messages)\n", rate, o.messages);
      }
    }
  }
  ::close(to_child[1]);  // the server exits on end of input
  server.wait(std::chrono::minutes(1));
  return rc;
}
