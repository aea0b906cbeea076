// Trace events in the Chrome trace-event format (docs/tracing.md), which Perfetto and
// chrome://tracing open.
//
// Off by default; TROUPE_TRACE=<dir> turns it on. Off, an event site costs one relaxed
// atomic load (`enabled()`). On, events are formatted into one process-wide buffer under a
// short lock and appended to `<dir>/<file>` when the buffer passes 64 KiB, half a second
// after the last write, and at exit: a killed process loses at most that much.
//
// A file is a JSON array with one event per line, never closed, so that it stays valid for
// the viewers after a crash ("]" is optional there). Timestamps are this host's monotonic
// clock in microseconds; a worker records its offset against rank 0 (`set_clock`), and
// `merge_files` applies the offsets into one trace.
//
// A build configured with -DTROUPE_TRACE_SITES=OFF has no trace sites: enabled() is a
// constant false, so every site guarded by it (and every span) compiles to nothing, and
// start() refuses with one warning. It exists to measure what the sites cost when tracing
// is off (bench/trace_overhead.py); the merge functions work in either build.
//
// Threading: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

#ifndef TROUPE_TRACE_SITES
#define TROUPE_TRACE_SITES 1
#endif

namespace troupe::trace {

/// Whether this build records trace events at all (the CMake option TROUPE_TRACE_SITES).
inline constexpr bool sites = TROUPE_TRACE_SITES != 0;

namespace detail {
/// 0: not decided yet, 1: off, 2: on.
extern std::atomic<int> state;
/// Decides from TROUPE_TRACE once (start(options_from_env())); returns whether it is on.
bool start_from_env() noexcept;
}  // namespace detail

/// Whether events are recorded. Off: one relaxed load (the first call reads TROUPE_TRACE).
/// Without trace sites: always false, known at compile time.
inline bool enabled() noexcept {
  if constexpr (!sites) {
    return false;
  } else {
    int s = detail::state.load(std::memory_order_relaxed);
    return s == 2 || (s == 0 && detail::start_from_env());
  }
}

/// This host's monotonic clock in nanoseconds (the clock of every timestamp here).
std::int64_t now_ns() noexcept;

/// The `args` object of an event, built up as JSON text.
class args {
 public:
  /// Adds `"key": "value"` (escaped); returns *this for chaining.
  args& add(std::string_view key, std::string_view value);
  /// Adds a string member.
  args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  /// Adds a number member.
  args& add(std::string_view key, std::int64_t value);
  /// Adds a number member.
  args& add(std::string_view key, std::uint64_t value);
  /// Adds a number member.
  args& add(std::string_view key, int value) { return add(key, static_cast<std::int64_t>(value)); }
  /// The members so far, without the braces.
  const std::string& json() const noexcept { return text_; }

 private:
  std::string text_;
};

/// What a flow arrow joins; part of its id, so that two kinds of message with the same
/// numbers never share an arrow.
enum class flow_channel : std::uint8_t {
  /// An RPC request (a call or a remote-reference fetch) and the span that served it.
  rpc = 0,
  /// An actor's plain send (numbered by the RPC request that carries it) and its delivery
  /// on the receiving worker.
  actor_send = 1,
  /// An actor's request (numbered by the sender's request id) and its delivery.
  actor_request = 2,
};

/// The id of the flow arrow of message `seq` sent by worker `origin` on `channel`. Both
/// sides compute it from what they know already (the sender's worker id, a number the
/// message carries), so nothing extra travels. Distinct for worker ids below 2^22 and
/// numbers below 2^40.
constexpr std::uint64_t flow_id(std::int32_t origin, std::uint64_t seq,
                                flow_channel channel = flow_channel::rpc) noexcept {
  return ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(origin) + 1) << 40) ^
          (seq & ((std::uint64_t{1} << 40) - 1))) ^
         (static_cast<std::uint64_t>(channel) << 62);
}

/// Which flow arrow, if any, an event starts or ends (ids are process-independent).
struct flow {
  /// Starts an arrow with this id at the span's start (0: none).
  std::uint64_t out = 0;
  /// Ends the arrow with this id at the span's start (0: none).
  std::uint64_t in = 0;
};

/// Records a complete span ('X') from `start_ns` to `end_ns`, on the calling thread unless
/// `tid` is given (non-zero), and the flow events of `f`. Does nothing when off.
void complete(std::string_view category, std::string_view name, std::int64_t start_ns,
              std::int64_t end_ns, const args& a = {}, flow f = {}, std::int64_t tid = 0);

/// Records an instant event ('i', process scope). Does nothing when off.
void instant(std::string_view category, std::string_view name, const args& a = {});

/// The calling thread's id as recorded in events.
std::int64_t thread_id() noexcept;

#if TROUPE_TRACE_SITES
/// A span from construction to destruction (or `end()`), recorded only if tracing was on
/// at construction.
class span {
 public:
  /// Starts the span; `category` and `name` must outlive it.
  span(std::string_view category, std::string_view name)
      : on_(enabled()), category_(category), name_(name), start_(on_ ? now_ns() : 0) {}
  span(const span&) = delete;
  span& operator=(const span&) = delete;
  /// Records the span unless end() did.
  ~span() { end(); }
  /// Whether the span will be recorded.
  bool on() const noexcept { return on_; }
  /// Details for the event (only meaningful when on()).
  trace::args& args() noexcept { return args_; }
  /// Records the span now (once).
  void end() {
    if (!on_) return;
    on_ = false;
    complete(category_, name_, start_, now_ns(), args_, flow_);
  }
  /// The flow arrows the span starts or ends.
  void set_flow(flow f) noexcept { flow_ = f; }

 private:
  bool on_;
  std::string_view category_, name_;
  std::int64_t start_;
  trace::args args_;
  flow flow_{};
};
#else
/// Without trace sites: a span that holds nothing and records nothing.
class span {
 public:
  /// Records nothing.
  span(std::string_view, std::string_view) noexcept {}
  span(const span&) = delete;
  span& operator=(const span&) = delete;
  /// Always false.
  static constexpr bool on() noexcept { return false; }
  /// Never used at run time: every caller asks on() first.
  trace::args& args() noexcept {
    static thread_local trace::args unused;
    return unused;
  }
  /// Does nothing.
  void end() noexcept {}
  /// Does nothing.
  void set_flow(flow) noexcept {}
};
#endif

/// How this process names its file and itself; `start` uses it instead of the environment.
struct process_options {
  /// The directory (created if missing).
  std::string dir;
  /// The file's name inside `dir`.
  std::string file_name;
  /// The trace's pid for this process (workers: their rank).
  std::int64_t pid = 0;
  /// The name the viewers show for it.
  std::string process_name;
};

/// Turns tracing on with `o` (before any event; later calls are ignored). An unwritable
/// directory logs one warning and leaves tracing off; returns whether it is on.
bool start(const process_options& o);

/// The options start_from_env uses: TROUPE_TRACE's directory, a file
/// "troupe-<run id>-rank-<RANK>-pid-<pid>.json", pid RANK (else the OS pid).
process_options options_from_env();

/// Records this process's clock offset against the reference (rank 0): its clock minus the
/// reference's, and the uncertainty (half the round trip of the best sample); negative
/// uncertainty: not measured. The merge subtracts the offset from every timestamp.
void set_clock(std::int64_t offset_ns, std::int64_t uncertainty_ns, std::string_view how);

/// Writes what is buffered to the file.
void flush() noexcept;

/// The file this process writes ("" when off).
std::string file_path();

/// What merge_files did.
struct merge_result {
  /// Input files merged.
  std::size_t files = 0;
  /// Events written.
  std::size_t events = 0;
};

/// Merges trace files (this module's per-process files, or merged files) into one JSON
/// object `{"traceEvents": [...]}` at `out`: each per-process file's timestamps are shifted
/// by its recorded clock offset; a file without one takes `default_offset_ns`. Fails (not_found,
/// unavailable) naming the file that cannot be read or written.
expected<merge_result> merge_files(const std::vector<std::string>& inputs, const std::string& out,
                                   std::int64_t default_offset_ns = 0);

/// The clock offset recorded in a per-process file, if any.
expected<std::int64_t> recorded_offset(const std::string& file);

}  // namespace troupe::trace
