// Runs a body on `world` gloo ranks as threads of this process (in-process store).
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "collectives/group.hpp"
#include "store/memory_store.hpp"

namespace troupe::training::testing {

template <class F>
std::vector<std::string> on_ranks(int world, F body) {
  auto s = std::make_shared<memory_store>();
  std::vector<std::string> out(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      collectives::world_options o;
      o.rank = r;
      o.size = world;
      o.store = s;
      o.backend = "gloo";
      o.timeout = std::chrono::seconds(10);
      auto g = collectives::init_world(o);
      out[static_cast<std::size_t>(r)] = g ? body(*g) : "init: " + g.error().to_string();
    });
  for (auto& t : ts) t.join();
  return out;
}

inline void check_all(const std::vector<std::string>& out) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    CHECK(out[r] == "");
  }
}

}  // namespace troupe::training::testing
