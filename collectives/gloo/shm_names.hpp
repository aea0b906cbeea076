// Names of the shared-memory segments in /dev/shm, and the sweep of names whose creator
// is gone. Internal to collectives/gloo.
//
// A segment's name lives only while its group is created: rank 0 creates it and every
// member unlinks it once all have answered. A rank 0 killed in between (before the others
// learned the name, or with the store it hosted) leaves the name behind, holding its
// memory. The name says who made it, "troupe-<pid>-<start>-<pid namespace>-<token>", so
// that a later creator on this host can tell that its maker is gone and remove it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::collectives::gloo_shm {

/// Start time (clock ticks since boot) of process `pid`, and whether it still runs (a
/// zombie does not); nullopt when there is no such process.
struct proc_state {
  std::uint64_t start = 0;
  bool running = false;
};
std::optional<proc_state> read_proc(int pid);

/// The inode of this process's pid namespace (0 when /proc does not say).
std::uint64_t pid_namespace();

/// Who made a segment, read back from its name.
struct segment_maker {
  int pid = 0;
  std::uint64_t start = 0;
  std::uint64_t pid_ns = 0;
};

/// `token` as segment names and rank 0's offer write it (lowercase hex).
std::string token_hex(std::uint64_t token);

/// The shm_open name ("/troupe-...") of a new segment of this process with `token`.
std::string segment_name(std::uint64_t token);

/// The FIFO through which member `from` of the segment named `name` (segment_name())
/// hands its allgather blocks to member `to` (shared_memory_pipes.cpp):
/// "/dev/shm<name>.<from>.<to>". It lives no longer than the segment's name.
std::string pipe_path(const std::string& name, int from, int to);

/// The maker of the segment named `file` (as listed in /dev/shm, without the slash), or of
/// the segment whose pipe it is; nullopt for a name of another form.
std::optional<segment_maker> parse_segment_name(std::string_view file);

/// Unlinks the names in `dir` (/dev/shm) of segments and pipes whose maker ran in this pid
/// namespace and is gone: no such process, a zombie, or its pid reused by a later process.
/// Names of live makers, of other pid namespaces (their pids mean nothing here) and of
/// other forms are left alone. Unlinking a name never disturbs members that mapped it.
/// Returns how many were removed.
int sweep_dead_segments(const std::string& dir = "/dev/shm");

}  // namespace troupe::collectives::gloo_shm
