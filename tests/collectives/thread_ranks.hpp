// Runs a body on `world` gloo ranks as threads of this process, over one in-process store.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include <troupe/collectives/group.hpp>
#include <troupe/store/memory_store.hpp>

namespace troupe::collectives::testing {

/// Runs `body` on each rank's world group (named `name`) and returns each rank's message,
/// "" for success or "init: ..." when the group did not form. The body takes the group as
/// `process_group&`, or as its `std::shared_ptr` when it keeps it (DDP).
template <class F>
std::vector<std::string> on_ranks(int world, F body, std::string name = "world") {
  auto s = std::make_shared<memory_store>();
  std::vector<std::string> out(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      world_options o;
      o.rank = r;
      o.size = world;
      o.store = s;
      o.backend = "gloo";
      o.name = name;
      o.timeout = std::chrono::seconds(10);
      auto g = init_world(o);
      auto& msg = out[static_cast<std::size_t>(r)];
      if (!g)
        msg = "init: " + g.error().to_string();
      else if constexpr (std::is_invocable_v<F&, process_group&>)
        msg = body(**g);
      else
        msg = body(*g);
    });
  for (auto& t : ts) t.join();
  return out;
}

/// Checks that every rank reported success.
inline void check_all(const std::vector<std::string>& out) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    CHECK(out[r] == "");
  }
}

}  // namespace troupe::collectives::testing
