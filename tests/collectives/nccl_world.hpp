// An NCCL world of one rank over an in-process store, for the GPU suites (the caller has
// checked that a device is usable; support/gpu_skip.hpp).
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

#include <troupe/collectives/group.hpp>
#include <troupe/store/memory_store.hpp>

namespace troupe::collectives::testing {

inline std::shared_ptr<process_group> nccl_world_of_one(const std::string& name = "world") {
  world_options o;
  o.rank = 0;
  o.size = 1;
  o.store = std::make_shared<memory_store>();
  o.backend = "nccl";
  o.name = name;
  o.timeout = std::chrono::seconds(30);
  auto g = init_world(o);
  REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.error().to_string()));
  return *g;
}

}  // namespace troupe::collectives::testing
