// training::elastic_loop in one process: the even split, refusals of bad arguments, and two
// members as threads over an in-process store. The deaths and joins are in
// elastic_multiprocess_test.cpp.
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/training/elastic_loop.hpp>
#include "support/membership_join.hpp"

using namespace std::chrono_literals;
using troupe::test::join_membership;
using namespace troupe;
using namespace troupe::training;

TEST_CASE("split_evenly gives contiguous parts that differ by at most one and cover everything") {
  for (int world = 1; world <= 7; ++world)
    for (std::int64_t items : {0, 1, 5, 64, 65}) {
      std::int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        auto [b, e] = split_evenly(items, r, world);
        CHECK(b == next);
        CHECK(e - b >= items / world);
        CHECK(e - b <= items / world + 1);
        next = e;
      }
      CHECK(next == items);
    }
  CHECK(split_evenly(10, 3, 2) == std::pair<std::int64_t, std::int64_t>{0, 0});
}

TEST_CASE("elastic_loop refuses no parameters, a gradient of another size, and zero steps") {
  auto s = std::make_shared<memory_store>();
  auto svc = join_membership(s, "solo");
  auto g = collectives::elastic_group::make(svc, s);
  REQUIRE(g.has_value());
  float w[4] = {}, gr[3] = {};
  auto none = elastic_loop::make(**g, {}, {}, {});
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().message().find("no parameters") != std::string::npos);
  parameter bad{"fc.weight", tensor_view::of(std::span<float>(w)),
                tensor_view::of(std::span<float>(gr))};
  auto sizes = elastic_loop::make(**g, {bad}, {}, {});
  REQUIRE_FALSE(sizes.has_value());
  CHECK(sizes.error().message().find("fc.weight") != std::string::npos);
  float g4[4] = {};
  parameter good{"fc.weight", tensor_view::of(std::span<float>(w)),
                 tensor_view::of(std::span<float>(g4))};
  elastic_loop_options zero;
  zero.steps = 0;
  auto steps = elastic_loop::make(**g, {good}, {}, zero);
  REQUIRE_FALSE(steps.has_value());
  CHECK(steps.error().message().find("steps") != std::string::npos);
  (*g)->shutdown(5s);
  CHECK(svc->shutdown(5s));
}

TEST_CASE("two members as threads train from rank 0's state and end with the same weights") {
  auto s = std::make_shared<memory_store>();
  auto a = join_membership(s, "a");
  auto b = join_membership(s, "b");
  struct member {
    std::shared_ptr<membership::service> svc;
    std::unique_ptr<collectives::elastic_group> group;
    std::vector<float> w, g;
    std::optional<expected<void>> result;
    std::int64_t steps = 0;
  };
  member m[2];
  m[0].svc = a;
  m[1].svc = b;
  for (int i = 0; i < 2; ++i) {
    auto g = collectives::elastic_group::make(m[i].svc, s);
    REQUIRE(g.has_value());
    m[i].group = std::move(*g);
    m[i].w.assign(8, static_cast<float>(i + 1));  // different starts: the broadcast aligns them
    m[i].g.assign(8, 0.f);
  }
  // Both know the epoch of two before either builds, so they build one group together.
  REQUIRE(m[0].group->wait_for_change(1, 10s).has_value());
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] {
      auto& me = m[i];
      parameter p{"w", tensor_view::of(std::span(me.w)), tensor_view::of(std::span(me.g))};
      elastic_loop_options o;
      o.steps = 20;
      o.timeout = 20s;
      auto loop = elastic_loop::make(*me.group, {p}, {}, o);
      if (!loop) {
        me.result = std::move(loop).error();
        return;
      }
      me.result = (*loop)->run(
          [&](const elastic_step& st) -> expected<void> {
            // The gradient of 0.5 * |w - target|^2 on this rank's half of 8 targets.
            auto [lo, hi] = split_evenly(8, st.rank, st.world);
            for (std::size_t k = 0; k < 8; ++k) me.g[k] = 0;
            for (auto k = lo; k < hi; ++k)
              me.g[static_cast<std::size_t>(k)] = me.w[static_cast<std::size_t>(k)] - 10.f;
            return ok();
          },
          [&](const elastic_step&) -> expected<void> {
            for (std::size_t k = 0; k < 8; ++k) me.w[k] -= 0.5f * me.g[k];
            return ok();
          });
      me.steps = (*loop)->steps_done();
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    REQUIRE(m[i].result.has_value());
    CHECK_MESSAGE(m[i].result->has_value(), m[i].result->error().to_string());
    CHECK(m[i].steps == 20);
  }
  CHECK(m[0].w == m[1].w);
  // Started from rank 0's 1.0 everywhere and moved toward 10.
  for (float v : m[0].w) {
    CHECK(v > 1.f);
    CHECK(v < 10.f);
  }
  for (int i = 0; i < 2; ++i) m[i].group->shutdown(5s);
  CHECK(b->shutdown(5s));
  CHECK(a->shutdown(5s));
}
