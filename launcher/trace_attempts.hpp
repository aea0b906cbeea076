// troupe-run's side of tracing (docs/tracing.md): its own trace file of launcher events
// (spawn, exit, restart), a directory per attempt for its workers' files, and the merge of
// both into one trace per attempt.
#pragma once

#include <functional>
#include <string>

namespace troupe::launcher {

class trace_attempts {
 public:
  /// Starts troupe-run's own trace file when TROUPE_TRACE names a directory; an unwritable
  /// one is reported once (core/trace.hpp) and the job runs without tracing.
  explicit trace_attempts(const std::string& run_id);

  /// Whether tracing is on.
  bool on() const noexcept { return on_; }

  /// The TROUPE_TRACE value for the workers of `attempt`: a directory of their own ("" when
  /// off, so that a worker does not try the unwritable directory again).
  std::string worker_dir(int attempt) const;

  /// Merges the worker files of `attempt` and troupe-run's own file into
  /// `<dir>/troupe-trace-<run id>-attempt-<attempt>.json`, then calls `say` with what it
  /// wrote or why it could not. Does nothing when off.
  void merge(int attempt, const std::function<void(const std::string&)>& say) const;

 private:
  bool on_ = false;
  std::string dir_;
  std::string run_id_;
};

}  // namespace troupe::launcher
