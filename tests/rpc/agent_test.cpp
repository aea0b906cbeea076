#include <doctest/doctest.h>

#include <mutex>

#include "group_fixture.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;

TEST_CASE("workers are found by name and by id, and listed in id order") {
  auto g = make_group(3);
  auto& a = *g[0];
  CHECK(a.self() == worker_info{"w0", 0});
  CHECK(a.workers() == std::vector<worker_info>{{"w0", 0}, {"w1", 1}, {"w2", 2}});
  CHECK(a.worker("w2")->id == 2);
  CHECK(a.worker_by_id(1)->name == "w1");
  auto missing = a.worker("w9");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code() == errc::not_found);
  CHECK(missing.error().message().find("w0, w1, w2") != std::string::npos);
  CHECK(*a.rpc_sync<int>(worker_ref::by_id(2), "add", 2, 2) == 4);
  shutdown_all(g);
}

TEST_CASE("an unknown worker or function is a clear error, the first at once") {
  auto g = make_group(2);
  auto t0 = clock::now();
  auto r = g[0]->rpc_sync<int>("nobody", "add", 1, 2);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::not_found);
  CHECK(clock::now() - t0 < std::chrono::milliseconds(50));
  auto f = g[0]->rpc_sync<int>("w1", "no_such_function", 1);
  REQUIRE_FALSE(f);
  CHECK(f.error().code() == errc::not_found);
  CHECK(f.error().worker() == "w1");
  CHECK(f.error().message().find("no_such_function") != std::string::npos);
  CHECK(f.error().message().find("add") != std::string::npos);
  shutdown_all(g);
}

TEST_CASE("callee errors, thrown or returned, reach the caller with the callee's name") {
  auto g = make_group(2);
  auto thrown = g[0]->rpc_sync<int>("w1", "fail", std::string("disk full"));
  REQUIRE_FALSE(thrown);
  CHECK(thrown.error().code() == errc::user_error);
  CHECK(thrown.error().worker() == "w1");
  CHECK(thrown.error().message() == "disk full");
  auto returned = g[1]->rpc_sync<int>("w0", "refuse");
  REQUIRE_FALSE(returned);
  CHECK(returned.error().code() == errc::invalid_argument);
  CHECK(returned.error().worker() == "w0");
  // Argument types that do not match the function's are refused by the callee.
  auto wrong = g[0]->rpc_sync<int>("w1", "add", std::string("x"));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == errc::invalid_argument);
  shutdown_all(g);
}

TEST_CASE("per-call timeouts and the default timeout fail slow calls promptly") {
  auto g = make_group(2, std::make_shared<memory_store>(), [](int, rpc_backend_options& o) {
    o.rpc_timeout = std::chrono::milliseconds(300);
  });
  auto t0 = clock::now();
  auto r =
      g[0]->rpc_sync<int>(call_options{std::chrono::milliseconds(100)}, "w1", "sleep_ms", 1000);
  auto took = clock::now() - t0;
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::timeout);
  CHECK(r.error().worker() == "w1");
  CHECK(took >= std::chrono::milliseconds(100));
  CHECK(took < std::chrono::milliseconds(400));
  t0 = clock::now();
  auto d = g[0]->rpc_async<int>("w1", "sleep_ms", 2000).get(std::chrono::seconds(5));
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::timeout);
  CHECK(clock::now() - t0 < std::chrono::milliseconds(900));
  // A fast call still works once a worker thread is free, and the late replies are ignored.
  auto later = g[0]->rpc_sync<int>(call_options{std::chrono::seconds(5)}, "w1", "add", 1, 1);
  REQUIRE_MESSAGE(later, (later ? "" : later.error().to_string()));
  CHECK(*later == 2);
  shutdown_all(g);
}

TEST_CASE("async calls pipeline and complete in any order") {
  auto g = make_group(2);
  std::vector<future<int>> fs;
  for (int i = 0; i < 200; ++i)
    fs.push_back(g[i % 2]->rpc_async<int>(i % 3 == 0 ? "w0" : "w1", "add", i, i));
  auto all = when_all(std::move(fs)).get(std::chrono::seconds(10));
  REQUIRE(all);
  for (int i = 0; i < 200; ++i) CHECK((*all)[static_cast<std::size_t>(i)] == 2 * i);
  auto v = g[0]->rpc_sync<std::vector<std::int64_t>>("w1", "make_vector", 5);
  REQUIRE(v);
  CHECK(*v == std::vector<std::int64_t>{0, 1, 4, 9, 16});
  shutdown_all(g);
}

TEST_CASE("a remote reference is fetched with to_here and freed when its last holder drops it") {
  auto g = make_group(2);
  auto& a = *g[0];
  auto& b = *g[1];
  {
    auto ref = a.remote<int>("w1", "add", 20, 22);
    CHECK(ref.owner().name == "w1");
    CHECK(*ref.to_here() == 42);
    CHECK(*ref.to_here() == 42);  // the owner keeps the value
    CHECK(b.owned_remote_refs() == 1);
    auto copy = ref;
    {
      auto moved = std::move(ref);
      CHECK(*moved.to_here() == 42);
    }
    CHECK(b.owned_remote_refs() == 1);  // `copy` still holds it
    auto t = tensor::from<float>(std::vector<float>{1, 2, 3}, dtype::float32);
    auto tref = a.remote<tensor>("w1", "echo", t);
    auto back = tref.to_here();
    REQUIRE(back);
    CHECK(same_values(*back, t));
    CHECK(b.owned_remote_refs() == 2);
  }
  // Both references were dropped: the owner frees the values.
  auto d = deadline::after(std::chrono::seconds(3));
  while (b.owned_remote_refs() != 0 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(b.owned_remote_refs() == 0);
  // A remote call that fails hands its error to to_here, with the owner's name.
  auto bad = a.remote<int>("w1", "fail", std::string("no value"));
  auto r = bad.to_here();
  REQUIRE_FALSE(r);
  CHECK(r.error().worker() == "w1");
  CHECK(r.error().message() == "no value");
  shutdown_all(g);
}

TEST_CASE("tensors cross the wire outside the arguments, strided views packed on the way") {
  auto g = make_group(2);
  std::vector<float> data(1 << 18);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  auto t = tensor::from<float>(data, dtype::float32);
  auto back = g[0]->rpc_sync<tensor>("w1", "echo", t);
  REQUIRE(back);
  CHECK(same_values(*back, t));
  CHECK(back->dev() == device::cpu());
  // A transposed 2x3 view of a 3x2 buffer.
  std::vector<std::int32_t> m{1, 2, 3, 4, 5, 6};
  auto view = tensor::wrap(m.data(), dtype::int32, {2, 3}, device::cpu(), {1, 2});
  REQUIRE(view);
  CHECK_FALSE(view->is_contiguous());
  auto packed = g[1]->rpc_sync<tensor>("w0", "echo", *view);
  REQUIRE(packed);
  CHECK(packed->is_contiguous());
  auto s = packed->as_span<std::int32_t>();
  CHECK(std::vector<std::int32_t>(s.begin(), s.end()) ==
        std::vector<std::int32_t>{1, 3, 5, 2, 4, 6});
  shutdown_all(g);
}

TEST_CASE("shutdown with calls in flight lets them finish, then meets the others") {
  auto g = make_group(2);
  std::vector<future<int>> fs;
  for (int i = 0; i < 6; ++i) fs.push_back(g[0]->rpc_async<int>("w1", "sleep_ms", 150));
  shutdown_all(g);
  for (auto& f : fs) {
    auto r = f.get(std::chrono::seconds(1));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
    CHECK(*r == 150);
  }
  // Idempotent, and calls after shutdown fail at once.
  CHECK(g[0]->shutdown());
  auto late = g[0]->rpc_sync<int>("w1", "add", 1, 2);
  REQUIRE_FALSE(late);
  CHECK(late.error().code() == errc::shut_down);
}

TEST_CASE("a function registered to run inline answers from the I/O thread") {
  auto fns = std::make_shared<function_table>();
  REQUIRE(fns->add(
      "id", [](int x) { return x; }, function_options{true}));
  auto dup = fns->add("id", [](int x) { return x; });
  REQUIRE_FALSE(dup);
  CHECK(dup.error().code() == errc::already_exists);
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  CHECK(*g[0]->rpc_sync<int>("w1", "id", 7) == 7);
  shutdown_all(g);
}

TEST_CASE("one-way calls run on the callee in the order sent and send nothing back") {
  auto seen = std::make_shared<std::vector<int>>();
  auto mu = std::make_shared<std::mutex>();
  auto fns = std::make_shared<function_table>();
  REQUIRE(fns->add(
      "record",
      [seen, mu](int x) {
        std::lock_guard lk(*mu);
        seen->push_back(x);
      },
      function_options{true}));
  REQUIRE(fns->add("count", [seen, mu] {
    std::lock_guard lk(*mu);
    return static_cast<int>(seen->size());
  }));
  REQUIRE(fns->add("boom", [](int) -> int { throw std::runtime_error("one-way failure"); }));
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  for (int i = 0; i < 500; ++i)
    REQUIRE(g[0]->notify("w1", "record", i).get(std::chrono::seconds(5)));
  // A failing one-way call is logged on the callee; the caller learns nothing and goes on.
  REQUIRE(g[0]->notify("w1", "boom", 1).get(std::chrono::seconds(5)));
  // An ordinary call after them on the same connection sees every one of them done.
  CHECK(*g[0]->rpc_sync<int>("w1", "count") == 500);
  {
    std::lock_guard lk(*mu);
    bool in_order = true;
    for (int i = 0; i < 500; ++i) in_order = in_order && (*seen)[static_cast<std::size_t>(i)] == i;
    CHECK(in_order);
  }
  // Sending to an unknown worker fails at once.
  auto bad = g[0]->notify("w9", "record", 1).get(std::chrono::seconds(5));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::not_found);
  shutdown_all(g);
}

TEST_CASE(
    "under an outside membership a broken worker stays until expelled by its tag, and its calls "
    "fail with the reason") {
  auto store = std::make_shared<memory_store>();
  std::vector<std::unique_ptr<agent>> g;
  for (int r = 0; r < 3; ++r) {
    auto o = base_options(store);
    o.functions = standard_functions();
    o.membership_tag = "incarnation-" + std::to_string(r);
    auto a = init_rpc("w" + std::to_string(r), r, std::nullopt, o);
    REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
    g.push_back(std::move(*a));
  }
  std::mutex mu;
  std::vector<membership_event> heard;
  g[0]->add_membership_listener([&](const membership_event& e) {
    std::lock_guard lk(mu);
    heard.push_back(e);
  });
  const error why(errc::membership_changed, "membership changed from epoch 3 to epoch 4; left: w1");
  // Another incarnation's tag, this worker itself, and a stranger change nothing.
  CHECK_FALSE(g[0]->expel("w1", "incarnation-9", why));
  CHECK_FALSE(g[0]->expel("w0", "", why));
  CHECK_FALSE(g[0]->expel("nobody", "", why));
  CHECK(g[0]->worker("w1").has_value());
  // A call waiting on w1 fails with the membership's reason once w1 is expelled.
  auto pending = g[0]->rpc_async<int>("w1", "sleep_ms", 3000);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(g[0]->expel("w1", "incarnation-1", why));
  auto r = pending.get(std::chrono::seconds(2));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::membership_changed);
  CHECK(r.error().message().find("epoch 4") != std::string::npos);
  CHECK_FALSE(g[0]->worker("w1").has_value());
  CHECK(g[0]->rpc_sync<int>("w2", "add", 1, 2).value_or(0) == 3);
  {
    std::lock_guard lk(mu);
    REQUIRE(heard.size() == 1);
    CHECK(heard[0].change == membership_change::failed);
    CHECK(heard[0].worker.name == "w1");
    CHECK(heard[0].reason.code() == errc::membership_changed);
  }
  // A second expel of the same worker changes nothing; its own leave is not heard again.
  CHECK_FALSE(g[0]->expel("w1", "", why));
  CHECK(g[1]->leave());
  CHECK(g[2]->leave());
  CHECK(g[0]->leave());
  std::lock_guard lk(mu);
  CHECK(heard.size() == 2);  // w1's failure, then w2's leave
}
