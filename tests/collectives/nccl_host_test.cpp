// The nccl backend's host-side logic, checked without a GPU: error mapping, the unique id
// exchange, the order of stream and event calls, and the watchdog's decisions.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <thread>

#include <troupe/collectives/comm_plan.hpp>
#include <troupe/collectives/nccl/nccl_comm.hpp>
#include <troupe/collectives/nccl/nccl_errors.hpp>
#include <troupe/collectives/nccl/nccl_group.hpp>
#include <troupe/collectives/nccl/stream_ordering.hpp>
#include <troupe/collectives/nccl/unique_id.hpp>
#include <troupe/collectives/nccl/watchdog.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/store/memory_store.hpp>
#include "support/skip.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

TEST_CASE("every NCCL result maps to the documented error code and keeps NCCL's text") {
  CHECK(nccl_errc(ncclUnhandledCudaError) == errc::unavailable);
  CHECK(nccl_errc(ncclSystemError) == errc::connection_lost);
  CHECK(nccl_errc(ncclRemoteError) == errc::connection_lost);
  CHECK(nccl_errc(ncclInternalError) == errc::internal);
  CHECK(nccl_errc(ncclInvalidArgument) == errc::invalid_argument);
  CHECK(nccl_errc(ncclInvalidUsage) == errc::invalid_argument);
  CHECK(nccl_errc(ncclInProgress) == errc::timeout);
  auto e = nccl_error(ncclRemoteError, "ncclAllReduce");
  CHECK(e.code() == errc::connection_lost);
  CHECK(e.message().find("ncclAllReduce failed") != std::string::npos);
  CHECK(e.message().find("(6)") != std::string::npos);
  CHECK(cuda_errc(cudaErrorInsufficientDriver) == errc::unavailable);
  CHECK(cuda_error(cudaErrorInvalidValue, "cudaMemcpy").message().find("cudaErrorInvalidValue") !=
        std::string::npos);
}

TEST_CASE("a shrink aborts the old operations first exactly when its plan says so") {
  CHECK(nccl_shrink_flags(true) == NCCL_SHRINK_ABORT);
  CHECK(nccl_shrink_flags(false) == NCCL_SHRINK_DEFAULT);
}

TEST_CASE("the NCCL library's version decides whether ncclCommShrink is used, without a device") {
  const int v = nccl_comm::library_version();
  CAPTURE(v);
  CHECK(v > 0);
  CHECK(nccl_comm::can_shrink() == shrink_supported(v));
  // Built with 2.28 headers: the library found at run time is at least as new here.
  if (v >= NCCL_VERSION_CODE) CHECK(nccl_comm::can_shrink());
}

TEST_CASE("rank 0 makes the communicator id and every other rank reads the same bytes") {
  auto s = std::make_shared<memory_store>();
  int made = 0;
  std::vector<expected<bytes>> got(3, bytes{});
  std::vector<std::thread> ts;
  for (int r = 2; r >= 0; --r)
    ts.emplace_back([&, r] {
      got[static_cast<std::size_t>(r)] =
          exchange_unique_id(*s, "g/unique_id", r, 5s, 4, [&]() -> expected<bytes> {
            ++made;
            return bytes{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
          });
    });
  for (auto& t : ts) t.join();
  CHECK(made == 1);
  for (auto& g : got) {
    REQUIRE(g.has_value());
    CHECK(*g == bytes{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}});
  }
}

TEST_CASE("a missing or malformed communicator id fails with the key named") {
  memory_store s;
  auto never = exchange_unique_id(s, "g/unique_id", 1, 50ms, 4, nullptr);
  REQUIRE_FALSE(never);
  CHECK(never.error().code() == errc::timeout);
  CHECK(never.error().message().find("g/unique_id") != std::string::npos);
  REQUIRE(s.set("h/unique_id", std::string_view("xy")));
  auto bad = exchange_unique_id(s, "h/unique_id", 1, 1s, 4, nullptr);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::protocol_error);
}

namespace {

// Records the calls; events are numbered from 1. Streams are named by the int they
// point to (null: the legacy default stream, "s0"). An event is live from create_event
// until as many destroy_event calls as it has owners.
class fake_streams final : public stream_api {
 public:
  std::vector<std::string> log;
  std::intptr_t next = 0;
  std::map<event, int> owners;
  bool fail_wait = false;
  bool fail_record = false;
  expected<event> create_event() override {
    auto e = reinterpret_cast<event>(++next);
    owners[e] = 1;
    return e;
  }
  void destroy_event(event e) noexcept override {
    if (e == nullptr) return;
    if (--owners[e] == 0) {
      owners.erase(e);
      log.push_back(strcat("give back e", id(e)));
    }
  }
  void retain(event e) noexcept override { ++owners[e]; }
  expected<void> record(event e, stream s) override {
    if (fail_record) return make_error(errc::internal, "record failed");
    log.push_back(strcat("record e", id(e), " on ", name(s)));
    return ok();
  }
  expected<void> wait(stream s, event e) override {
    if (fail_wait) return make_error(errc::internal, "wait failed");
    log.push_back(strcat(name(s), " waits e", id(e)));
    return ok();
  }
  expected<bool> query(event) override { return true; }
  std::size_t live() const { return owners.size(); }
  static std::intptr_t id(event e) { return reinterpret_cast<std::intptr_t>(e); }
  static std::string name(stream s) {
    return s == nullptr ? "s0" : strcat("s", *static_cast<int*>(s));
  }
};

std::function<expected<void>(stream_api::stream)> logged_launch(fake_streams& api) {
  return [&api](stream_api::stream s) -> expected<void> {
    api.log.push_back("launch on " + fake_streams::name(s));
    return ok();
  };
}

}  // namespace

TEST_CASE("operations on one stream run on it in order with one event each and no waits") {
  fake_streams api;
  int one = 1;
  stream_sequencer order(api);
  auto a = order.launch(&one, logged_launch(api));
  auto b = order.launch(&one, logged_launch(api));
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(api.log == std::vector<std::string>{"launch on s1", "record e1 on s1", "launch on s1",
                                            "record e2 on s1"});
  // Each end event belongs to the caller; the sequencer keeps the last one as well.
  api.destroy_event(*a);
  api.destroy_event(*b);
  CHECK(api.live() == 1);
}

TEST_CASE("an operation on another stream waits for the end of the one before it") {
  fake_streams api;
  int one = 1, two = 2;
  stream_sequencer order(api);
  auto a = order.launch(&one, logged_launch(api));
  REQUIRE(a.has_value());
  api.destroy_event(*a);  // the watchdog saw it finish: the sequencer still holds it
  CHECK(api.live() == 1);
  auto b = order.launch(&two, logged_launch(api));
  REQUIRE(b.has_value());
  auto c = order.launch(nullptr, logged_launch(api));
  REQUIRE(c.has_value());
  CHECK(api.log == std::vector<std::string>{"launch on s1", "record e1 on s1", "s2 waits e1",
                                            "launch on s2", "record e2 on s2", "give back e1",
                                            "s0 waits e2", "launch on s0", "record e3 on s0"});
  api.destroy_event(*b);
  api.destroy_event(*c);
  {
    stream_sequencer other(api);  // a sequencer gives back its last event when it goes
    auto d = other.launch(&one, logged_launch(api));
    REQUIRE(d.has_value());
    api.destroy_event(*d);
  }
  CHECK(api.live() == 1);  // e3, held by `order`
}

TEST_CASE("a failed launch or stream call leaks no event, reports the error and keeps the order") {
  fake_streams api;
  int one = 1, two = 2;
  stream_sequencer order(api);
  auto bad = order.launch(&one, [](stream_api::stream) -> expected<void> {
    return make_error(errc::connection_lost, "x");
  });
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::connection_lost);
  CHECK(api.live() == 0);
  auto a = order.launch(&one, logged_launch(api));
  REQUIRE(a.has_value());
  api.destroy_event(*a);
  api.fail_wait = true;
  auto w = order.launch(&two, logged_launch(api));
  REQUIRE_FALSE(w);
  CHECK(api.live() == 1);  // e1, still the end of the last operation
  api.fail_wait = false;
  api.fail_record = true;
  auto r = order.launch(&one, logged_launch(api));
  REQUIRE_FALSE(r);
  CHECK(api.live() == 1);
  api.fail_record = false;
  api.log.clear();
  auto next = order.launch(&two, logged_launch(api));
  REQUIRE(next.has_value());
  CHECK(api.log.front() == "s2 waits e1");
  api.destroy_event(*next);
}

namespace {

std::pair<pending_op, work> op(std::uint64_t seq, clock::time_point deadline) {
  auto [w, c] = work::make(strcat("op #", seq));
  pending_op p;
  p.seq = seq;
  p.what = strcat("op #", seq);
  p.timeout = 1s;
  p.deadline = deadline;
  p.done_event = reinterpret_cast<void*>(static_cast<std::intptr_t>(seq));
  p.completer = c;
  return {std::move(p), std::move(w)};
}

}  // namespace

TEST_CASE("the watchdog completes finished operations in order and leaves running ones") {
  auto now = clock::now();
  std::deque<pending_op> q;
  for (std::uint64_t s = 1; s <= 3; ++s) q.push_back(op(s, now + 10s).first);
  auto v = watchdog_poll(
      q, now, [](void* e) -> expected<bool> { return reinterpret_cast<std::intptr_t>(e) == 1; },
      ok());
  CHECK(v.finished.size() == 1);
  CHECK(v.finished[0].seq == 1);
  CHECK_FALSE(v.cause);
  CHECK(q.size() == 2);
}

TEST_CASE("a passed deadline fails that operation and every later one with a timeout") {
  auto now = clock::now();
  std::deque<pending_op> q;
  q.push_back(op(1, now - 1ms).first);
  q.push_back(op(2, now + 10s).first);
  auto v = watchdog_poll(
      q, now, [](void*) -> expected<bool> { return false; }, ok());
  REQUIRE(v.cause);
  CHECK(v.cause->code() == errc::timeout);
  CHECK(v.failed.size() == 2);
  CHECK(q.empty());
}

TEST_CASE("an asynchronous communicator error or a device error fails everything pending") {
  auto now = clock::now();
  {
    std::deque<pending_op> q;
    q.push_back(op(1, now + 10s).first);
    auto v = watchdog_poll(
        q, now, [](void*) -> expected<bool> { return false; },
        nccl_error(ncclRemoteError, "the communicator"));
    REQUIRE(v.cause);
    CHECK(v.cause->code() == errc::connection_lost);
    CHECK(v.failed.size() == 1);
  }
  {
    std::deque<pending_op> q;
    q.push_back(op(1, now + 10s).first);
    auto v = watchdog_poll(
        q, now, [](void*) -> expected<bool> { return make_error(errc::internal, "ECC"); }, ok());
    REQUIRE(v.cause);
    CHECK(v.cause->message().find("device failed") != std::string::npos);
    CHECK(v.failed.size() == 1);
  }
}

TEST_CASE("the nccl backend is registered and refused as unavailable without a CUDA device") {
  auto info = find_backend("nccl");
  REQUIRE(info.has_value());
  auto n = cuda_device_count();
  if (n && *n > 0) TROUPE_SKIP_TEST("a CUDA device is present; the gpu suite covers this");
  CHECK_FALSE(info->viable());
  auto g = create_group("nccl", group_spec{"g", 0, 1, {0}, std::make_shared<memory_store>()});
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::unavailable);
}

TEST_CASE("the CUDA device follows the local rank from the environment, else the world rank") {
  ::unsetenv("TROUPE_LOCAL_RANK");
  ::unsetenv("LOCAL_RANK");
  CHECK(nccl_device_for(5, 4) == 1);
  ::setenv("LOCAL_RANK", "2", 1);
  CHECK(nccl_device_for(5, 4) == 2);
  ::setenv("TROUPE_LOCAL_RANK", "3", 1);
  CHECK(nccl_device_for(5, 4) == 3);
  ::unsetenv("TROUPE_LOCAL_RANK");
  ::unsetenv("LOCAL_RANK");
}
