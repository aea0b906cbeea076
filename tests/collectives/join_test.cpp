// Join with gloo ranks as threads of one process (an in-process store, real TCP groups).
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <troupe/store/memory_store.hpp>
#include "join_scenarios.hpp"
#include "thread_ranks.hpp"

using namespace troupe;
using namespace troupe::collectives;
using namespace troupe::collectives::testing;

TEST_CASE("with uneven inputs at 2 to 4 ranks joined ranks shadow until all joined") {
  for (int world = 2; world <= 4; ++world) {
    CAPTURE(world);
    check_all(on_ranks(world, join_uneven));
  }
}

TEST_CASE("throw on early termination stops every rank with an error, not a hang") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    check_all(on_ranks(world, join_throws));
  }
}

TEST_CASE("a disabled join scope behaves as no join scope") {
  check_all(on_ranks(3, join_disabled));
}

TEST_CASE("joinables on different process groups are refused on every rank") {
  check_all(on_ranks(2, join_refuses_groups));
}

TEST_CASE("a rank more than 1000 iterations behind logs one skew warning") {
  std::atomic<int> warnings{0};
  set_log_sink([&](std::string_view line) {
    if (line.find("uneven input skew") != std::string_view::npos) ++warnings;
  });
  auto out = on_ranks(2, join_shadows_a_long_skew);
  set_log_sink(nullptr);
  check_all(out);
  CHECK(warnings.load() == 1);
}

TEST_CASE("a single rank's scope finishes at once with is_last_joiner set") {
  check_all(on_ranks(1, [](process_group& g) -> std::string {
    all_reducer a(g);
    auto j = join::make({&a});
    if (!j) return j.error().to_string();
    auto r = j->run([&] { return a.step(); });
    if (!r) return r.error().to_string();
    if (!a.last_joiner || a.main_hooks != 0 || a.post_hooks != 1) return "wrong hooks";
    auto again = j->finish();
    if (again || again.error().code() != errc::invalid_argument) return "finish ran twice";
    return {};
  }));
}
