// process_group::abort on gloo ranks as threads: pending, queued and later work fails at
// once with the abort's error, never at its timeout. Built twice: with shared memory
// (collectives_tests) and over TCP alone (collectives_tcp_tests, TROUPE_GLOO_SHM=0), so
// both transports' blocking waits are shown to be interrupted.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/registry.hpp>
#include <troupe/store/memory_store.hpp>
#include "thread_ranks.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using troupe::collectives::testing::on_ranks;

namespace {

// Far longer than any wait below: an operation that ends near it was not interrupted.
constexpr auto op_timeout = 60s;
// How long an interrupted operation may take to fail on a loaded two-core machine.
constexpr auto prompt = 5s;

troupe::error abort_error() {
  return make_error(errc::membership_changed, "test: the epoch moved to 9");
}

// Checks `r` failed with the abort's code, naming the operation and the abort's reason.
std::string check_aborted(const expected<void>& r, std::string_view op) {
  if (r) return std::string(op) + " succeeded after the abort";
  if (r.error().code() != errc::membership_changed)
    return std::string(op) + " failed with another error: " + r.error().to_string();
  if (r.error().message().find("the epoch moved to 9") == std::string::npos)
    return std::string(op) + "'s error lacks the abort's reason: " + r.error().to_string();
  if (r.error().message().find(op) == std::string::npos)
    return "the error does not name " + std::string(op) + ": " + r.error().to_string();
  return "";
}

}  // namespace

TEST_CASE(
    "an aborted group fails its pending allreduce at once with the abort's error, and every later "
    "one too") {
  std::atomic<bool> done{false};
  auto out = on_ranks(2, [&](process_group& g) -> std::string {
    if (g.rank() == 1) {
      // Never joins the allreduce; waits until rank 0 is through, then leaves.
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return "";
    }
    std::int32_t x[4] = {1, 2, 3, 4};
    tensor_view v{x, dtype::int32, 4, device::cpu()};
    auto w = g.allreduce(v, {reduce_op::sum, op_timeout});
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);
      g.abort(abort_error());
    });
    const auto start = std::chrono::steady_clock::now();
    auto r = w.wait(op_timeout + 10s);  // may run the allreduce on this thread
    const auto took = std::chrono::steady_clock::now() - start;
    aborter.join();
    done = true;
    if (auto m = check_aborted(r, "allreduce #2"); !m.empty()) return m;
    if (took > prompt) return "the pending allreduce failed only after its wait was long";
    auto later = g.allreduce(v, {reduce_op::sum, op_timeout}).wait(prompt);
    if (auto m = check_aborted(later, "allreduce #3"); !m.empty()) return m;
    auto f = g.failure();
    if (!f || f->code() != errc::membership_changed) return "failure() is not the abort's error";
    return "";
  });
  testing::check_all(out);
}

TEST_CASE("abort fails operations queued behind a blocked one, and a pending receive") {
  std::atomic<bool> done{false};
  auto out = on_ranks(2, [&](process_group& g) -> std::string {
    if (g.rank() == 1) {
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return "";
    }
    std::int32_t x[2] = {1, 2}, y[2] = {0, 0};
    tensor_view v{x, dtype::int32, 2, device::cpu()};
    tensor_view in{y, dtype::int32, 2, device::cpu()};
    auto recv = g.recv(in, 1, {3, op_timeout});
    std::vector<work> queued;
    for (int i = 0; i < 3; ++i) queued.push_back(g.allreduce(v, {reduce_op::sum, op_timeout}));
    // Started by the worker at once (a future asks for that), so it blocks on rank 1.
    auto first = queued.front().get_future();
    std::this_thread::sleep_for(200ms);
    const auto start = std::chrono::steady_clock::now();
    g.abort(abort_error());
    auto r = first.get(prompt);
    std::string msg = check_aborted(r, "allreduce #2");
    for (int i = 1; i < 3 && msg.empty(); ++i)
      msg = check_aborted(queued[static_cast<std::size_t>(i)].wait(prompt),
                          "allreduce #" + std::to_string(i + 2));
    if (msg.empty()) msg = check_aborted(recv.wait(prompt), "recv #p1");
    if (msg.empty() && std::chrono::steady_clock::now() - start > prompt)
      msg = "the aborted operations took too long to fail";
    done = true;
    return msg;
  });
  testing::check_all(out);
}

TEST_CASE("a member that aborts makes the others' next exchange with it fail promptly") {
  std::atomic<bool> aborted{false};
  auto out = on_ranks(2, [&](process_group& g) -> std::string {
    std::int32_t x[2] = {1, 2};
    tensor_view v{x, dtype::int32, 2, device::cpu()};
    if (g.rank() == 0) {
      g.abort(abort_error());
      aborted = true;
      return check_aborted(g.barrier({op_timeout}).wait(prompt), "barrier #2");
    }
    while (!aborted.load()) std::this_thread::sleep_for(5ms);
    const auto start = std::chrono::steady_clock::now();
    auto r = g.allreduce(v, {reduce_op::sum, op_timeout}).wait(op_timeout + 10s);
    if (r) return "an allreduce with an aborted member succeeded";
    if (std::chrono::steady_clock::now() - start > prompt)
      return "the survivor waited long for an aborted member: " + r.error().to_string();
    return "";
  });
  testing::check_all(out);
}

TEST_CASE("a second abort, or an abort of a group that already failed, keeps the first error") {
  auto out = on_ranks(1, [](process_group& g) -> std::string {
    g.abort(abort_error());
    g.abort(make_error(errc::aborted, "a later reason"));
    auto f = g.failure();
    if (!f || f->code() != errc::membership_changed) return "the first abort's error was replaced";
    std::int32_t x = 1;
    auto r = g.allreduce(tensor_view{&x, dtype::int32, 1, device::cpu()}, {}).wait(prompt);
    return check_aborted(r, "allreduce #2");
  });
  testing::check_all(out);
}

TEST_CASE("a group's setup ends soon after its interrupt fires, while a member never arrives") {
  // Rank 1 never comes: rank 0 waits for it in the store, which only the interrupt ends.
  group_spec spec;
  spec.name = "interrupted-setup";
  spec.rank = 0;
  spec.size = 2;
  spec.global_ranks = {0, 1};
  spec.root_store = std::make_shared<memory_store>();
  spec.timeout = op_timeout;
  const auto start = std::chrono::steady_clock::now();
  spec.interrupt = [start]() -> std::optional<troupe::error> {
    if (std::chrono::steady_clock::now() - start < 200ms) return std::nullopt;
    return abort_error();
  };
  auto g = create_group("gloo", spec);
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(g.has_value());
  CHECK(g.error().code() == errc::membership_changed);
  CHECK(g.error().message().find("the epoch moved to 9") != std::string::npos);
  CHECK(took < prompt);
}
