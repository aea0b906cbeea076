#include <doctest/doctest.h>

#include <troupe/collectives/group.hpp>

using namespace troupe;
using namespace troupe::collectives;

TEST_CASE(
    "the parallel layout places model ranks together, then pipeline stages, then data replicas") {
  auto l = parallel_layout::make(8, 2, 2).value();
  CHECK(l.data == 2);
  CHECK(l.model_group(5) == std::vector<int>{4, 5});
  CHECK(l.pipeline_group(5) == std::vector<int>{5, 7});
  CHECK(l.data_group(5) == std::vector<int>{1, 5});
  // Every rank is in exactly one group of each kind and the groups tile the world.
  for (int r = 0; r < 8; ++r) {
    for (auto g : {l.model_group(r), l.pipeline_group(r), l.data_group(r)}) {
      CHECK(std::find(g.begin(), g.end(), r) != g.end());
    }
  }
  auto trivial = parallel_layout::make(3, 1, 1).value();
  CHECK(trivial.data_group(2) == std::vector<int>{0, 1, 2});
  CHECK(trivial.model_group(2) == std::vector<int>{2});
}

TEST_CASE("degrees that do not divide the world size are refused with the numbers") {
  auto l = parallel_layout::make(6, 4, 1);
  REQUIRE_FALSE(l);
  CHECK(l.error().code() == errc::invalid_argument);
  const auto& m = l.error().message();
  CHECK(m.find("world size 6") != std::string::npos);
  CHECK(m.find("model degree 4") != std::string::npos);
  CHECK(m.find("= 4") != std::string::npos);
  CHECK_FALSE(parallel_layout::make(4, 0, 1));
}
