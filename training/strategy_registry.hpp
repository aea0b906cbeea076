// The strategy registry: training strategies by name, each with how its worker processes
// are started and its DDP settings. The built-in entries are the DDP names and aliases
// that training scripts commonly use:
//
//   ddp, ddp_find_unused_parameters_{false,true}                 start method exec
//   ddp_spawn, ddp_spawn_find_unused_parameters_{false,true}     start method spawn
//   ddp_fork, ddp_fork_find_unused_parameters_{false,true}       start method fork
//   ddp_notebook, ddp_notebook_find_unused_parameters_{false,true}  start method fork
//
// Start methods: exec (workers are separate programs started by troupe-run, torchrun or
// srun), spawn (a fresh process re-executes this program per rank), fork (the calling
// process forks one child per rank, as troupe::launch does; works in notebooks).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe::training {

enum class start_method { exec, spawn, fork };

std::string_view to_string(start_method m) noexcept;
/// Reads "exec", "spawn" or "fork" ("popen" is read as exec); the error lists them.
expected<start_method> parse_start_method(std::string_view text);

struct strategy_info {
  /// The registered name, e.g. "ddp_spawn_find_unused_parameters_true".
  std::string name;
  /// The strategy it builds, e.g. "ddp".
  std::string strategy;
  start_method start = start_method::exec;
  /// Set when the name fixes DDP's find_unused_parameters; unset leaves the default.
  std::optional<bool> find_unused_parameters;
  /// One line for humans.
  std::string description;
};

class strategy_registry {
 public:
  /// A registry holding the built-in DDP names.
  static strategy_registry with_builtins();
  /// The process-wide registry (built-ins plus what the program registered).
  static strategy_registry& global();

  /// Adds an entry; a name taken before is errc::already_exists, an empty one
  /// invalid_argument.
  expected<void> add(strategy_info info);
  /// The entry of `name`; not_found listing every known name otherwise.
  expected<strategy_info> find(std::string_view name) const;
  /// Every registered name, sorted.
  std::vector<std::string> names() const;

 private:
  std::vector<strategy_info> entries_;
};

}  // namespace troupe::training
