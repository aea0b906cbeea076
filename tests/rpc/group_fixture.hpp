// In-process groups of agents for the RPC tests: real TCP connections on 127.0.0.1, one
// memory store shared by the agents of a group.
#pragma once

#include <doctest/doctest.h>

#include <thread>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/memory_store.hpp>

namespace troupe::rpc::testing {

inline std::shared_ptr<function_table> standard_functions() {
  auto t = std::make_shared<function_table>();
  (void)t->add("add", [](int a, int b) { return a + b; });
  (void)t->add("echo", [](tensor x) { return x; });
  (void)t->add("sleep_ms", [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  });
  (void)t->add("fail", [](std::string why) -> int { throw std::runtime_error(why); });
  (void)t->add("refuse", []() -> expected<int> {
    return make_error(errc::invalid_argument, "refused on purpose");
  });
  (void)t->add("make_vector", [](int n) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i * i;
    return v;
  });
  return t;
}

inline rpc_backend_options base_options(std::shared_ptr<store> s) {
  rpc_backend_options o;
  o.store = std::move(s);
  o.rpc_timeout = std::chrono::seconds(10);
  o.init_timeout = std::chrono::seconds(10);
  o.shutdown_timeout = std::chrono::seconds(10);
  o.device_count = 0;
  o.num_worker_threads = 2;
  return o;
}

/// Starts a static group of `n` agents named w0..w{n-1}; `tweak(rank, options)` may
/// change each one's options first.
template <class Tweak>
std::vector<std::unique_ptr<agent>> make_group(int n, std::shared_ptr<store> s, Tweak tweak) {
  std::vector<expected<std::unique_ptr<agent>>> results;
  for (int r = 0; r < n; ++r) results.emplace_back(error(errc::internal, "not started"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto o = base_options(s);
      o.functions = standard_functions();
      tweak(r, o);
      results[static_cast<std::size_t>(r)] = init_rpc("w" + std::to_string(r), r, n, o);
    });
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<agent>> out;
  for (auto& r : results) {
    REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
    out.push_back(std::move(*r));
  }
  return out;
}

inline std::vector<std::unique_ptr<agent>> make_group(int n) {
  return make_group(n, std::make_shared<memory_store>(), [](int, rpc_backend_options&) {});
}

/// Shuts a static group down from every member at once (each waits at the barrier).
inline void shutdown_all(std::vector<std::unique_ptr<agent>>& g) {
  std::vector<std::thread> ts;
  for (auto& a : g) ts.emplace_back([&a] { CHECK(a->shutdown()); });
  for (auto& t : ts) t.join();
}

}  // namespace troupe::rpc::testing
