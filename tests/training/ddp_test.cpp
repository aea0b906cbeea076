// DDP with gloo ranks as threads of one process.
#include <doctest/doctest.h>

#include "../collectives/thread_ranks.hpp"
#include "ddp_scenarios.hpp"

using namespace troupe::training::testing;
using namespace troupe::collectives::testing;

TEST_CASE("ddp training with uneven shards under join equals single-process training") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    check_all(on_ranks(world, ddp_matches_single_process));
  }
}

TEST_CASE("ddp broadcasts rank 0's weights and averages gradients kept in separate buffers") {
  for (int world : {1, 3}) {
    CAPTURE(world);
    check_all(on_ranks(world, ddp_broadcasts_and_averages));
  }
}

TEST_CASE("under no_sync gradients accumulate locally and the next step averages the sum") {
  check_all(on_ranks(3, ddp_no_sync_accumulates));
}

TEST_CASE("allreduce, fp16, bf16 and user comm hooks leave the average in every bucket") {
  check_all(on_ranks(2, ddp_comm_hooks));
}

TEST_CASE("model averaging all-reduces gradients in warm-up, then averages weights every period") {
  check_all(on_ranks(3, ddp_model_averaging));
}

TEST_CASE("an unused parameter is refused by name unless find_unused_parameters is set") {
  check_all(on_ranks(2, ddp_unused_parameters));
}

TEST_CASE("barrier, object broadcast and reduce work and a different parameter list is refused") {
  check_all(on_ranks(3, ddp_strategy_collectives));
}
