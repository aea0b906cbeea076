// Remote references passed between workers: shares, forks and their release.
#include <doctest/doctest.h>

#include <mutex>

#include "group_fixture.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;

namespace {

// A user type that carries a reference.
struct ref_box {
  remote_ref<int> ref;
  std::string next;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ref_box& b) {
  return f(meta::type_name("ref_box"), b.ref, b.next);
}

// What each worker keeps, and the agents, for functions that call on.
struct shared_state {
  std::mutex mu;
  std::map<int, std::vector<remote_ref<int>>> kept;
  std::vector<agent*> agents;
  agent& at(int rank) {
    std::lock_guard lk(mu);
    return *agents[static_cast<std::size_t>(rank)];
  }
  void keep(int rank, remote_ref<int> r) {
    std::lock_guard lk(mu);
    kept[rank].push_back(std::move(r));
  }
  void drop(int rank) {
    std::vector<remote_ref<int>> gone;
    std::lock_guard lk(mu);
    gone.swap(kept[rank]);
  }
};

void add_ref_functions(function_table& t, int rank, std::shared_ptr<shared_state> s) {
  // Keeps the reference and fetches its value.
  (void)t.add("hold", [rank, s](remote_ref<int> r) -> expected<int> {
    s->keep(rank, r);
    return r.to_here(std::chrono::seconds(5));
  });
  // Waits first, so that the sender has long dropped its own copy.
  (void)t.add("hold_later", [rank, s](remote_ref<int> r) -> expected<int> {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s->keep(rank, r);
    return r.to_here(std::chrono::seconds(5));
  });
  // Keeps the reference, fetches it, and passes it on to the worker named in the box.
  (void)t.add("pass_on", [rank, s](ref_box b) -> expected<int> {
    s->keep(rank, b.ref);
    auto mine = b.ref.to_here(std::chrono::seconds(5));
    if (!mine) return mine;
    auto theirs = s->at(rank).rpc_sync<int>(b.next, "hold", b.ref);
    if (!theirs) return theirs;
    return *mine + *theirs;
  });
  // Makes a reference to a value on `owner` and returns it (this worker drops its copy).
  (void)t.add("make_ref", [rank, s](std::string owner, int v) {
    return s->at(rank).remote<int>(owner, "add", v, 0);
  });
  (void)t.add("drop", [rank, s] { s->drop(rank); });
  (void)t.add("is_empty", [](remote_ref<int> r) -> std::optional<int> {
    if (r.valid()) return 1;
    return std::nullopt;
  });
  (void)t.add("store_ref_remotely",
              [rank, s](int v) { return s->at(rank).remote<int>("w1", "add", v, 0); });
}

std::vector<std::unique_ptr<agent>> make_ref_group(int n, std::shared_ptr<shared_state> s) {
  auto g = make_group(n, std::make_shared<memory_store>(), [s](int rank, rpc_backend_options& o) {
    add_ref_functions(*o.functions, rank, s);
  });
  std::lock_guard lk(s->mu);
  for (auto& a : g) s->agents.push_back(a.get());
  return g;
}

bool owned_becomes(agent& a, std::size_t n, duration limit = std::chrono::seconds(3)) {
  auto d = deadline::after(limit);
  while (a.owned_remote_refs() != n && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return a.owned_remote_refs() == n;
}

}  // namespace

TEST_CASE(
    "a reference passed on twice is fetched by every holder and freed after the last drops it") {
  auto s = std::make_shared<shared_state>();
  auto g = make_ref_group(4, s);
  auto& owner = *g[1];
  {
    auto ref = g[0]->remote<int>("w1", "add", 20, 22);
    // w0 -> w2 inside a user type, then w2 -> w3 as a plain argument.
    auto both = g[0]->rpc_sync<int>("w2", "pass_on", ref_box{ref, "w3"});
    REQUIRE_MESSAGE(both, (both ? "" : both.error().to_string()));
    CHECK(*both == 84);
    CHECK(owner.owned_remote_refs() == 1);
    auto v = ref.to_here();
    REQUIRE(v);
    CHECK(*v == 42);
  }
  // w0 dropped its copy; w2 and w3 still hold theirs.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(owner.owned_remote_refs() == 1);
  REQUIRE(g[0]->rpc_sync<void>("w2", "drop"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(owner.owned_remote_refs() == 1);
  {
    // The last holder can still fetch it, and copy it on to the owner and back.
    std::lock_guard lk(s->mu);
    REQUIRE(s->kept[3].size() == 1);
    auto v = s->kept[3][0].to_here();
    REQUIRE_MESSAGE(v, (v ? "" : v.error().to_string()));
    CHECK(*v == 42);
  }
  REQUIRE(g[0]->rpc_sync<void>("w3", "drop"));
  CHECK(owned_becomes(owner, 0));
  shutdown_all(g);
}

TEST_CASE("a reference returned as a result belongs to the caller") {
  auto s = std::make_shared<shared_state>();
  auto g = make_ref_group(3, s);
  {
    auto ref = g[0]->rpc_sync<remote_ref<int>>("w2", "make_ref", std::string("w1"), 7);
    REQUIRE_MESSAGE(ref, (ref ? "" : ref.error().to_string()));
    CHECK(ref->owner().name == "w1");
    auto seven = ref->to_here();
    REQUIRE(seven);
    CHECK(*seven == 7);
    // w2 dropped its copy when the function returned; the caller's share keeps the value.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(g[1]->owned_remote_refs() == 1);
    auto async_ref = g[0]->rpc_async<remote_ref<int>>("w2", "make_ref", std::string("w0"), 9)
                         .get(std::chrono::seconds(5));
    REQUIRE(async_ref);
    auto nine = async_ref->to_here();  // owned by the receiver itself
    REQUIRE(nine);
    CHECK(*nine == 9);
    CHECK(g[0]->owned_remote_refs() == 1);
  }
  CHECK(owned_becomes(*g[1], 0));
  CHECK(owned_becomes(*g[0], 0));
  // A reference kept inside a remote value has no single receiver: refused, clearly.
  auto nested = g[0]->remote<remote_ref<int>>("w2", "store_ref_remotely", 1);
  auto r = nested.to_here();
  REQUIRE_FALSE(r);
  CHECK(r.error().message().find("remote value") != std::string::npos);
  shutdown_all(g);
}

TEST_CASE("a reference sent to its owner is fetched there through the owner's own connection") {
  auto s = std::make_shared<shared_state>();
  auto g = make_ref_group(2, s);
  {
    auto ref = g[0]->remote<int>("w1", "add", 1, 2);
    CHECK(*g[0]->rpc_sync<int>("w1", "hold", ref) == 3);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(g[1]->owned_remote_refs() == 1);
  REQUIRE(g[0]->rpc_sync<void>("w1", "drop"));
  CHECK(owned_becomes(*g[1], 0));
  shutdown_all(g);
}

TEST_CASE("dropping the sender's copy right after sending never frees the value early") {
  auto s = std::make_shared<shared_state>();
  auto g = make_ref_group(3, s);
  std::vector<future<int>> fs;
  for (int i = 0; i < 20; ++i) {
    auto ref = g[0]->remote<int>("w1", "add", i, 0);
    fs.push_back(g[0]->rpc_async<int>("w2", "hold_later", ref));
    // `ref` is dropped here, long before w2 fetches.
  }
  auto all = when_all(std::move(fs)).get(std::chrono::seconds(10));
  REQUIRE_MESSAGE(all, (all ? "" : all.error().to_string()));
  for (int i = 0; i < 20; ++i) CHECK((*all)[static_cast<std::size_t>(i)] == i);
  CHECK(g[1]->owned_remote_refs() == 20);
  REQUIRE(g[0]->rpc_sync<void>("w2", "drop"));
  CHECK(owned_becomes(*g[1], 0));
  shutdown_all(g);
}

TEST_CASE("the shares of a holder that leaves the group are released by the owner") {
  auto s = std::make_shared<shared_state>();
  auto store = std::make_shared<memory_store>();
  std::vector<std::unique_ptr<agent>> g;
  for (int r = 0; r < 3; ++r) {
    auto o = base_options(store);
    o.functions = standard_functions();
    add_ref_functions(*o.functions, r, s);
    auto a = init_rpc("w" + std::to_string(r), r, std::nullopt, o);
    REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
    g.push_back(std::move(*a));
  }
  {
    std::lock_guard lk(s->mu);
    for (auto& a : g) s->agents.push_back(a.get());
  }
  {
    auto ref = g[0]->remote<int>("w1", "add", 4, 5);
    CHECK(*g[0]->rpc_sync<int>("w2", "hold", ref) == 9);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(g[1]->owned_remote_refs() == 1);
  // w2 leaves while still holding its share (its copy outlives its agent).
  REQUIRE(g[2]->leave());
  CHECK(owned_becomes(*g[1], 0));
  s->drop(2);  // a release after the agent is gone does nothing
  CHECK(g[0]->leave());
  CHECK(g[1]->leave());
}

TEST_CASE("a remote_ref outside an RPC message is refused with a clear error") {
  auto s = std::make_shared<shared_state>();
  auto g = make_ref_group(2, s);
  auto ref = g[0]->remote<int>("w1", "add", 1, 1);
  bytes out;
  auto r = serialize(out, nullptr, ref);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::unsupported);
  // A reference whose creating call never left cannot be passed on.
  auto broken = g[0]->rpc_sync<remote_ref<int>>("w1", "make_ref", std::string("nobody"), 1);
  REQUIRE_FALSE(broken);
  CHECK(broken.error().code() == errc::invalid_argument);
  CHECK(broken.error().message().find("never sent") != std::string::npos);
  // An empty reference travels as empty.
  auto empty = g[0]->rpc_sync<std::optional<int>>("w1", "is_empty", remote_ref<int>());
  REQUIRE(empty);
  CHECK(*empty == std::nullopt);
  shutdown_all(g);
}
