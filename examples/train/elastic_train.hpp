// train_demo's elastic mode: the same MLP trained with training::elastic_loop on the world
// group that follows the job's membership, so that a worker that dies is replaced while the
// others keep training in the same processes (troupe-run --failure-policy replace).
//
// Global step s trains on the `global_batch` samples that start at
// (s mod steps_per_epoch) * global_batch, split evenly over the members of the current
// epoch; the loop averages the members' gradients over that epoch's size and every member
// takes one SGD step. Every member starts from the same weights (one seed), and each records
// the world size of every step it applied: that sequence, which the membership's epochs
// decide, is all a single process needs to replay the run (replay_elastic below).
#pragma once

#include <cstdint>
#include <vector>

#include <troupe/core/time.hpp>
#include <troupe/world/world.hpp>
#include "mlp.hpp"

namespace troupe::examples {

struct elastic_settings {
  int epochs = 5;
  int samples = 8192;
  /// Samples per launched worker and step: the global batch is batch * WORLD_SIZE.
  int batch = 32;
  int features = 16, hidden = 64, classes = 4;
  float lr = 0.2f;
  double tolerance = 1e-4;
  duration timeout = std::chrono::seconds(30);
  /// One worker (a launched rank other than 0, chosen by `seed`) kills itself with SIGKILL
  /// at a step chosen by `seed` in the middle half of the run, on its first start only.
  bool kill_one = false;
  /// The same on every worker; 0: derived from the run id.
  std::uint64_t seed = 0;
  /// Print "recovery: ..." lines with wall-clock times (ns since the epoch): the kill, a
  /// replacement's start (`started_ns`, taken at the top of main(), so troupe::init
  /// counts), and each member's first completed step after every resize
  /// (bench/elastic_bench.sh reads them).
  bool recovery_report = false;
  long long started_ns = 0;
};

/// Trains in the elastic world `w` (w.elastic() is set), prints the loss per epoch from the
/// member that is rank 0 at the epoch's last step, and checks at the end that every member
/// holds identical weights and that they match replay_elastic() of the recorded world
/// sizes within `tolerance`. Returns the exit code: 0, or 1 with the reason on stderr.
int train_elastic(world& w, const elastic_settings& s);

/// One process doing what the group did: at step i the `worlds[i]` members' gradients of
/// their parts of the step's batch, summed in rank order, divided by worlds[i], one SGD step.
std::vector<float> replay_elastic(const dataset& d, const std::vector<int>& worlds,
                                  int global_batch, float lr, std::uint64_t seed, int in,
                                  int hidden, int out);

}  // namespace troupe::examples
