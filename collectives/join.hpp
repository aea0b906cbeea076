// Join: training with uneven inputs. Ranks that run out of inputs early "join": they keep
// shadowing the collectives that the other ranks still make in each iteration, until
// every rank has joined; then each joinable's post hook runs once on every rank.
//
//   ddp model(...);                            // a joinable
//   auto j = join::make({&model}).value();      // every rank, same joinables, same order
//   auto r = j.run([&]() -> expected<void> {
//     for (auto& batch : my_shard) TROUPE_TRY(train_step(model, batch));
//     return ok();
//   });                                         // returns once every rank has joined
//
// Contract:
// - A joinable calls join::notify_join_context(*this) before its per-iteration
//   collectives. Only the first joinable of the scope makes the notification's collectives
//   (an all-reduce saying "not joined yet" and, with throw_on_early_termination, one that
//   checks whether some rank has joined); for the others, and outside an enabled scope,
//   the call does nothing.
// - A joined rank loops: it counts the ranks not yet joined (an all-reduce matching their
//   notification); while any remain it runs every main hook, which must make the same
//   collectives, in the same order, as one iteration of a non-joined rank. When none
//   remain, every post hook runs with is_last_joiner (true on the ranks that joined last).
// - With throw_on_early_termination, the first rank to run out stops every rank: it and
//   all the others get errc::aborted (operation "join") instead of continuing.
// - A rank that shadows more than 1000 iterations logs a warning once (the skew costs).
// - All joinables must share one process group (the same object); otherwise make() is
//   refused. Collectives are bounded by the options' timeout; nothing waits forever.
// - Threading: a scope belongs to the thread that made it; hooks run on that thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <troupe/collectives/process_group.hpp>
#include <troupe/collectives/scratch_buffer.hpp>

namespace troupe::collectives {

/// Arguments a join scope forwards to every joinable's join_hook(), by name.
class join_args {
 public:
  using value = std::variant<bool, std::int64_t, double, std::string>;
  join_args() = default;
  join_args(std::initializer_list<std::pair<const std::string, value>> init) : values_(init) {}

  join_args& set(std::string key, value v) {
    values_[std::move(key)] = std::move(v);
    return *this;
  }
  bool contains(const std::string& key) const { return values_.contains(key); }
  /// The value of `key` as T (bool, int64_t, double or std::string); `fallback` when
  /// absent; errc::invalid_argument naming the key when it holds another type.
  template <class T>
  expected<T> get(const std::string& key, T fallback) const;
  /// The names given, sorted (for refusing unknown ones).
  std::vector<std::string> keys() const;

 private:
  std::map<std::string, value> values_;
};

/// What a joinable does on a joined rank.
class join_hook {
 public:
  virtual ~join_hook() = default;
  /// Runs once per iteration while some rank has not joined; makes the collectives of
  /// one iteration of a non-joined rank.
  virtual expected<void> main_hook() { return ok(); }
  /// Runs once after all ranks joined; is_last_joiner is true on the ranks that joined
  /// last (those that never shadowed an iteration).
  virtual expected<void> post_hook(bool is_last_joiner) {
    (void)is_last_joiner;
    return ok();
  }
};

/// What the current join scope asks of a joinable. Disabled outside a scope.
struct join_config {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
  duration timeout = default_timeout();
};

/// A class that can take part in a join scope.
class joinable {
 public:
  joinable() = default;
  joinable(const joinable&) = delete;
  joinable& operator=(const joinable&) = delete;
  /// Waits (up to the scope timeout each) for notifications still in flight.
  virtual ~joinable();

  /// The hook for one scope; `args` are the scope's arguments. Refuse unknown or
  /// mistyped arguments with errc::invalid_argument.
  virtual expected<std::unique_ptr<::troupe::collectives::join_hook>> join_hook(
      const join_args& args) = 0;
  /// The device of the scope's counters (that of the group's tensors).
  virtual device join_device() const = 0;
  /// The group the joinable's collectives run on.
  virtual process_group& join_process_group() const = 0;

  /// The current scope's settings for this joinable.
  const struct join_config& join_config() const noexcept { return config_; }

 private:
  friend class join;
  struct join_config config_;
  bool in_scope_ = false;
  // Buffers of notifications whose all-reduce may still run (the group reads them).
  std::vector<std::pair<work, scratch_buffer>> in_flight_;
};

struct join_options {
  /// false: the scope does nothing (use only when inputs are known to be even).
  bool enable = true;
  /// Stop every rank with errc::aborted as soon as one runs out of inputs.
  bool throw_on_early_termination = false;
  /// Forwarded to every joinable's join_hook().
  join_args args;
  /// Bound of each of the scope's collectives.
  duration timeout = default_timeout();
};

class join {
 public:
  /// Opens a scope over `joinables` (non-null, kept alive by the caller until the scope
  /// ends): asks each for its hook and sets its join_config. Refuses an empty list, a null
  /// entry, a joinable in another scope, and joinables on different process groups.
  static expected<join> make(std::vector<joinable*> joinables, join_options options = {});

  join(join&& other) noexcept;
  join& operator=(join&&) = delete;
  /// Ends the scope without collectives: the joinables' configs are disabled again.
  ~join();

  /// Called by a joinable before its per-iteration collectives (see the contract).
  /// Returns the work of the "not joined" all-reduce for the first joinable of an enabled
  /// scope, nothing otherwise; errc::aborted when throw_on_early_termination is set and
  /// some rank has joined.
  static expected<std::optional<work>> notify_join_context(joinable& j);

  /// This rank has run out of inputs: shadow the others until all joined, then run the
  /// post hooks; ends the scope. A disabled scope only ends. Call once.
  expected<void> finish();

  /// Runs `body` (returning void or expected<void>; it may throw), then finish(). An
  /// error or exception from `body` ends the scope at once and is passed on.
  template <class F>
  expected<void> run(F&& body);

  /// Iterations this rank shadowed in finish() (its main hooks ran that many times).
  std::int64_t shadowed_iterations() const noexcept { return shadowed_; }

 private:
  join() = default;
  void close() noexcept;
  expected<std::int32_t> allreduce_flag(std::int32_t value);
  /// Sums `value` over the group and waits for the result; the buffer is parked in
  /// `parking` when the wait fails, since the group may still write it.
  static expected<std::int32_t> sum_flag(process_group& g, device where, std::int32_t value,
                                         duration timeout,
                                         std::vector<std::pair<work, scratch_buffer>>& parking);

  std::vector<joinable*> joinables_;
  std::vector<std::unique_ptr<join_hook>> hooks_;
  // Counters whose all-reduce failed to finish in time stay alive with the scope.
  std::vector<std::pair<work, scratch_buffer>> in_flight_;
  process_group* group_ = nullptr;
  device device_;
  join_options options_;
  std::int64_t shadowed_ = 0;
  bool open_ = false;
};

template <class T>
expected<T> join_args::get(const std::string& key, T fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (auto* v = std::get_if<T>(&it->second)) return *v;
  if constexpr (std::is_same_v<T, double>)
    if (auto* i = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*i);
  return make_error(errc::invalid_argument, "join argument '", key, "' has the wrong type; pass a ",
                    std::is_same_v<T, bool>           ? "bool"
                    : std::is_same_v<T, std::int64_t> ? "integer"
                    : std::is_same_v<T, double>       ? "number"
                                                      : "string");
}

template <class F>
expected<void> join::run(F&& body) {
  expected<void> r;
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>)
      body();
    else
      r = body();
  } catch (...) {
    close();
    throw;
  }
  if (!r) {
    close();
    return r;
  }
  return finish();
}

}  // namespace troupe::collectives
