// Building groups: the world group, subgroups by rank list or by color, and the
// data-/model-/pipeline-parallel layout. Every function here is collective over the
// parent group: all its members call it, in the same order relative to each other.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <troupe/collectives/process_group.hpp>

namespace troupe::collectives {

struct world_options {
  int rank = 0;
  int size = 1;
  std::shared_ptr<troupe::store> store;
  /// Backend name; empty for default_backend().
  std::string backend;
  /// Group name, also the key prefix in the store; use a fresh one to rebuild a world.
  std::string name = "world";
  duration timeout = default_timeout();
};

/// Joins the world group; runs one small allreduce to check every rank arrived.
expected<std::shared_ptr<process_group>> init_world(const world_options& o);

struct subgroup_options {
  /// Backend name; empty for the parent's backend.
  std::string backend;
  duration timeout = default_timeout();
};

/// A group of the parent's ranks `ranks` (parent group ranks, any order: the new group's
/// rank i is ranks[i]). Members get the group, the other ranks a null pointer.
expected<std::shared_ptr<process_group>> new_group(process_group& parent, std::vector<int> ranks,
                                                   const subgroup_options& o = {});

/// Splits the parent by `color`: ranks with the same color form a group, ordered by
/// (key, parent rank). A negative color joins no group (null result).
expected<std::shared_ptr<process_group>> split(process_group& parent, int color, int key,
                                               const subgroup_options& o = {});

/// Degrees of parallelism: world = data * pipeline * model. World rank r has
/// model rank r % model, pipeline rank (r / model) % pipeline, data rank
/// r / (model * pipeline).
struct parallel_layout {
  int world = 1;
  int model = 1;
  int pipeline = 1;
  int data = 1;

  /// Refuses degrees that do not divide the world, with the numbers.
  static expected<parallel_layout> make(int world_size, int model, int pipeline);
  /// The world ranks of the model-/pipeline-/data-parallel group holding `rank`.
  std::vector<int> model_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  std::vector<int> data_group(int rank) const;
};

struct parallelism_options {
  int model = 1;
  int pipeline = 1;
  /// Backends per kind of group; empty for the world's backend.
  std::string model_backend;
  std::string pipeline_backend;
  std::string data_backend;
  duration timeout = default_timeout();
};

struct parallel_groups {
  parallel_layout layout;
  std::shared_ptr<process_group> model;
  std::shared_ptr<process_group> pipeline;
  std::shared_ptr<process_group> data;
};

/// Builds this rank's model-, pipeline- and data-parallel groups from the world group.
expected<parallel_groups> init_parallelism(process_group& world, const parallelism_options& o);

}  // namespace troupe::collectives
