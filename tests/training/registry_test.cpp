// The strategy registry and bucket planning (no groups involved).
#include <doctest/doctest.h>

#include <troupe/training/buckets.hpp>
#include <troupe/training/strategy_registry.hpp>

using namespace troupe;
using namespace troupe::training;

TEST_CASE("every DDP name and alias maps to its start method and find_unused_parameters") {
  auto r = strategy_registry::with_builtins();
  struct row {
    const char* name;
    start_method start;
    std::optional<bool> fup;
  };
  const row rows[] = {
      {"ddp", start_method::exec, {}},
      {"ddp_spawn", start_method::spawn, {}},
      {"ddp_fork", start_method::fork, {}},
      {"ddp_notebook", start_method::fork, {}},
      {"ddp_find_unused_parameters_false", start_method::exec, false},
      {"ddp_find_unused_parameters_true", start_method::exec, true},
      {"ddp_spawn_find_unused_parameters_false", start_method::spawn, false},
      {"ddp_spawn_find_unused_parameters_true", start_method::spawn, true},
      {"ddp_fork_find_unused_parameters_false", start_method::fork, false},
      {"ddp_fork_find_unused_parameters_true", start_method::fork, true},
      {"ddp_notebook_find_unused_parameters_false", start_method::fork, false},
      {"ddp_notebook_find_unused_parameters_true", start_method::fork, true},
  };
  for (auto& x : rows) {
    CAPTURE(x.name);
    auto e = r.find(x.name);
    REQUIRE(e.has_value());
    CHECK(e->strategy == "ddp");
    CHECK(e->start == x.start);
    CHECK(e->find_unused_parameters == x.fup);
    CHECK(!e->description.empty());
  }
  CHECK(r.names().size() == std::size(rows));
}

TEST_CASE("an unknown strategy name is refused listing the known ones") {
  auto e = strategy_registry::with_builtins().find("dpp");
  REQUIRE(!e);
  CHECK(e.error().code() == errc::not_found);
  CHECK(e.error().message().find("'dpp'") != std::string::npos);
  CHECK(e.error().message().find("ddp_notebook_find_unused_parameters_true") != std::string::npos);
}

TEST_CASE("a strategy name registered twice is refused and a new one is found") {
  auto r = strategy_registry::with_builtins();
  auto dup = r.add({"ddp", "ddp", start_method::exec, std::nullopt, "again"});
  REQUIRE(!dup);
  CHECK(dup.error().code() == errc::already_exists);
  REQUIRE(r.add({"my_ddp", "ddp", start_method::spawn, true, "mine"}).has_value());
  CHECK(r.find("my_ddp")->start == start_method::spawn);
  CHECK(!r.add({"", "ddp", start_method::exec, std::nullopt, ""}));
  CHECK(parse_start_method("popen").value() == start_method::exec);
  CHECK(!parse_start_method("thread"));
  CHECK(strategy_registry::global().find("ddp_spawn").has_value());
}

TEST_CASE("buckets follow reverse registration order, split by dtype and by the byte caps") {
  std::vector<float> f(100), fg(100);
  std::vector<double> d(10), dg(10);
  auto view = [](std::vector<float>& v, std::size_t o, std::size_t n) {
    return tensor_view::of(std::span(v).subspan(o, n));
  };
  std::vector<parameter> ps{
      {"a", view(f, 0, 10), view(fg, 0, 10)},    // 40 bytes
      {"b", view(f, 10, 20), view(fg, 10, 20)},  // 80 bytes
      {"c", tensor_view::of(std::span(d)), tensor_view::of(std::span(dg))},
      {"d", view(f, 30, 5), view(fg, 30, 5)},    // 20 bytes
      {"e", view(f, 35, 40), view(fg, 35, 40)},  // 160 bytes, above the cap
  };
  REQUIRE(check_parameters(ps).has_value());
  auto plan = plan_buckets(ps, 16, 100).value();
  // float: e (first cap), then d+b, then a; double: c.
  REQUIRE(plan.size() == 4);
  CHECK(plan[0].params == std::vector<std::size_t>{4});
  CHECK(plan[1].params == std::vector<std::size_t>{3, 1});
  CHECK(plan[2].params == std::vector<std::size_t>{2});
  CHECK(plan[2].type == dtype::float64);
  CHECK(plan[3].params == std::vector<std::size_t>{0});
  CHECK(plan[1].nbytes == 100);
  CHECK(!plan_buckets(ps, 0, 100));
  // Bad parameter lists name the culprit.
  ps[1].grad = view(fg, 10, 19);
  auto bad = check_parameters(ps);
  REQUIRE(!bad);
  CHECK(bad.error().message().find("'b'") != std::string::npos);
}
