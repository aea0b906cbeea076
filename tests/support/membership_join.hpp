// join_membership: one member of a job's membership, joined over a store (under the prefix
// "membership") with short heartbeats (100 ms, declared dead after 2 s), for the suites
// that run elastic members as threads of one process. Fails the test if the join fails.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

#include <troupe/membership/service.hpp>
#include <troupe/store/prefix_store.hpp>

namespace troupe::test {

inline std::shared_ptr<membership::service> join_membership(std::shared_ptr<store> s,
                                                            const std::string& name) {
  using namespace std::chrono_literals;
  membership::service_options o;
  o.name = name;
  o.host = "here";
  o.heartbeat_timeout = 2s;
  o.heartbeat_interval = 100ms;
  auto svc = membership::service::join(std::make_shared<prefix_store>(s, "membership"), o, 10s);
  REQUIRE_MESSAGE(svc.has_value(), svc.error().to_string());
  return std::shared_ptr<membership::service>(std::move(*svc));
}

}  // namespace troupe::test
