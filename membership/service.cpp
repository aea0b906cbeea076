#include <troupe/membership/service.hpp>

#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/membership/settings.hpp>

namespace troupe::membership {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::string_view epoch_key = "epoch";
constexpr duration builtin_heartbeat_timeout = std::chrono::seconds(10);

std::string history_key(std::uint64_t number) { return strcat("epoch/", number); }

std::string heartbeat_key(const member& m) {
  return strcat("heartbeat/", m.name, "/", m.incarnation);
}

expected<epoch> decode_bytes(const bytes& b) { return decode(to_string(b)); }

// A duration setting, or `fallback` when it is unset or bad (reported once per read).
duration duration_setting(const setting& s, duration fallback) {
  const auto env = s.value();
  if (!env) return fallback;
  auto parsed = parse_duration(*env);
  if (!parsed || parsed->count() <= 0) {
    TROUPE_LOG(log_level::warn, "membership", "ignoring ", s.variable, "='", *env,
               "': ", parsed ? std::string("it must be positive") : parsed.error().message(),
               "; using ", format_duration(fallback));
    return fallback;
  }
  return *parsed;
}

std::string random_incarnation() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t{rd()} << 32) ^ rd() ^
                    static_cast<std::uint64_t>(clock_type::now().time_since_epoch().count()) ^
                    (static_cast<std::uint64_t>(::getpid()) << 17);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return out;
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

error timed_out(const store& s, const epoch_change& change, duration timeout) {
  return make_error(errc::timeout, "no epoch agreed on in ", format_duration(timeout),
                    " for the change '", change.cause, "' over ", s.describe(),
                    "; is the store reachable and not overloaded?");
}

}  // namespace

duration heartbeat_timeout_from_env() {
  return duration_setting(settings::heartbeat_timeout, builtin_heartbeat_timeout);
}

duration heartbeat_interval_from_env(duration timeout) {
  return duration_setting(settings::heartbeat_interval, std::max(duration(1), timeout / 10));
}

expected<epoch> read_epoch(store& s, duration timeout) {
  const std::string keys[] = {std::string(epoch_key)};
  auto present = s.check(keys, timeout);
  if (!present) return std::move(present).error();
  if (!*present) return epoch{};
  auto got = s.get(epoch_key, timeout);
  if (!got) return std::move(got).error();
  return decode_bytes(*got);
}

expected<epoch> read_epoch(store& s, std::uint64_t number, duration timeout) {
  auto got = s.get(history_key(number), timeout);
  if (!got) return std::move(got).error();
  auto e = decode_bytes(*got);
  if (e && e->number != number)
    return make_error(errc::protocol_error, "the history key ", history_key(number),
                      " holds epoch ", e->number);
  return e;
}

expected<epoch> apply_change(store& s, const epoch_change& change, duration timeout) {
  const auto dl = deadline::after(timeout);
  auto left = [&]() -> expected<duration> {
    auto r = dl.remaining();
    if (r <= duration::zero()) return timed_out(s, change, timeout);
    return r;
  };
  std::optional<bytes> seen;
  {
    TROUPE_TRY(left());
    const std::string keys[] = {std::string(epoch_key)};
    auto present = s.check(keys, dl.remaining());
    if (!present) return std::move(present).error();
    if (*present) {
      auto got = s.get(epoch_key, dl.remaining());
      if (!got) return std::move(got).error();
      seen = std::move(*got);
    }
  }
  for (;;) {
    epoch current;
    if (seen) {
      auto decoded = decode_bytes(*seen);
      if (!decoded) return std::move(decoded).error();
      current = std::move(*decoded);
      // The history holds every epoch that another is built on (docs/membership.md).
      auto r = left();
      if (!r) return std::move(r).error();
      TROUPE_TRY(s.set(history_key(current.number), *seen, *r));
    }
    auto next = next_epoch(current, change);
    if (!next) return std::move(next).error();
    if (next->number == current.number) return current;
    const bytes desired = to_bytes(encode(*next));
    auto r = left();
    if (!r) return std::move(r).error();
    auto stored = s.compare_set(epoch_key, seen, desired, *r);
    if (!stored) return std::move(stored).error();
    if (*stored == desired) {
      auto w = left();
      if (!w) return std::move(w).error();
      TROUPE_TRY(s.set(history_key(next->number), desired, *w));
      return next;
    }
    // Lost to another proposer: re-apply the change to the epoch that won.
    if (stored->empty())
      seen.reset();
    else
      seen = std::move(*stored);
  }
}

struct service::state {
  std::shared_ptr<store> s;
  service_options opts;
  member self;

  mutable std::mutex mu;
  std::condition_variable cv;
  epoch current;
  std::optional<error> sticky;
  bool stopping = false;
  bool beating = true;
  bool leaving = false;
  std::map<std::uint64_t, callback> callbacks;
  std::uint64_t next_callback = 1;

  std::mutex shutdown_mu;
  std::optional<expected<void>> shutdown_result;
  std::thread heart;
  std::thread watcher;

  // Touched by the watcher thread only.
  struct beat {
    std::int64_t value = 0;
    clock_type::time_point changed;
  };
  std::map<std::string, beat> beats;

  bool should_stop() const {
    std::lock_guard lk(mu);
    return stopping;
  }

  void fail(error e) {
    {
      std::lock_guard lk(mu);
      if (!sticky) sticky = std::move(e);
      beating = false;
    }
    cv.notify_all();
  }

  void heartbeat_loop() {
    const std::string key = heartbeat_key(self);
    bool warned = false;
    for (;;) {
      auto r = s->add(key, 1, opts.op_timeout);
      if (!r && !warned) {
        TROUPE_LOG(log_level::warn, "membership", describe(self),
                   " could not write its heartbeat: ", r.error(),
                   "; the others will declare it dead if this lasts ",
                   format_duration(opts.heartbeat_timeout));
        warned = true;
      } else if (r) {
        warned = false;
      }
      std::unique_lock lk(mu);
      if (cv.wait_for(lk, opts.heartbeat_interval, [&] { return stopping || !beating; })) return;
    }
  }

  void deliver(const epoch& e) {
    epoch before;
    std::vector<callback> cbs;
    {
      std::lock_guard lk(mu);
      if (e.number <= current.number) return;
      before = current;
      current = e;
      if (!e.contains(self.name, self.incarnation) && !leaving && !sticky) {
        auto changed = membership_changed_error(before, e);
        sticky = make_error(errc::membership_changed, "this worker, ", describe(self),
                            ", is not in epoch ", e.number, ": ", changed.message());
        beating = false;
      }
      for (const auto& [id, cb] : callbacks) cbs.push_back(cb);
    }
    cv.notify_all();
    TROUPE_LOG(log_level::info, "membership", "epoch ", e.number, ": ", e.size(), " members (",
               e.names(), "); cause: ", e.cause);
    if (trace::enabled())
      trace::instant("membership", "epoch",
                     trace::args()
                         .add("epoch", static_cast<std::uint64_t>(e.number))
                         .add("members", e.names())
                         .add("cause", e.cause));
    for (const auto& cb : cbs) {
      try {
        cb(before, e);
      } catch (const std::exception& ex) {
        TROUPE_LOG(log_level::error, "membership", "an epoch subscriber threw: ", ex.what());
      } catch (...) {
        TROUPE_LOG(log_level::error, "membership", "an epoch subscriber threw");
      }
    }
  }

  // Reads the epochs after the current one and delivers them in order. False on a sticky
  // failure.
  bool catch_up() {
    auto latest = read_epoch(*s, opts.op_timeout);
    if (!latest) {
      if (latest.error().code() == errc::timeout) return true;
      fail(std::move(latest).error());
      return false;
    }
    std::uint64_t from = 0;
    {
      std::lock_guard lk(mu);
      from = current.number + 1;
    }
    for (std::uint64_t n = from; n <= latest->number; ++n) {
      if (n == latest->number) {
        deliver(*latest);
        break;
      }
      auto e = read_epoch(*s, n, opts.op_timeout);
      if (!e) {
        if (e.error().code() == errc::timeout) return true;
        fail(std::move(e).error());
        return false;
      }
      deliver(*e);
    }
    return true;
  }

  // Reads every other member's heartbeat; declares dead those silent for the timeout.
  void check_heartbeats() {
    epoch e;
    {
      std::lock_guard lk(mu);
      if (!beating) return;
      e = current;
    }
    std::vector<std::pair<member, duration>> silent;
    std::map<std::string, beat> kept;
    for (const auto& m : e.members) {
      if (m.name == self.name && m.incarnation == self.incarnation) continue;
      const std::string key = heartbeat_key(m);
      const auto asked = clock_type::now();
      auto v = s->add(key, 0, opts.op_timeout);
      const auto now = clock_type::now();
      if (!v) {
        if (v.error().code() != errc::timeout) {
          fail(std::move(v).error());
          return;
        }
        if (auto it = beats.find(key); it != beats.end()) kept.insert(*it);
        continue;
      }
      auto it = beats.find(key);
      beat b = it == beats.end() ? beat{*v, now} : it->second;
      // A read that took half the timeout (this process was stopped or starved, or the
      // store stalled) restarts the count: the silence may be this watcher's own.
      if (b.value != *v || now - asked > opts.heartbeat_timeout / 2) b = beat{*v, now};
      const auto quiet = std::chrono::duration_cast<duration>(now - b.changed);
      if (quiet >= opts.heartbeat_timeout) silent.emplace_back(m, quiet);
      kept.emplace(key, b);
    }
    beats = std::move(kept);
    if (silent.empty()) return;
    epoch_change change;
    // Only while this member is still in the epoch: one that was itself taken out (it
    // was stopped, say) and has not read that yet removes nobody.
    change.proposer = member_ref{self.name, self.incarnation};
    change.cause = "dead: ";
    for (std::size_t i = 0; i < silent.size(); ++i) {
      const auto& [m, quiet] = silent[i];
      TROUPE_LOG(log_level::warn, "membership", describe(self), " declares ", describe(m),
                 " dead: its heartbeat has not advanced for ", format_duration(quiet), " (",
                 settings::heartbeat_timeout.variable, " ", format_duration(opts.heartbeat_timeout),
                 "); proposing an epoch after ", e.number, " without it");
      if (i > 0) change.cause += "; ";
      change.cause += strcat(describe(m), ": heartbeat silent for ", format_duration(quiet),
                             ", seen by ", self.name);
      change.remove.push_back({m.name, m.incarnation});
    }
    auto r = apply_change(*s, change, opts.op_timeout);
    if (!r) {
      TROUPE_LOG(log_level::warn, "membership",
                 "could not agree on an epoch without the silent "
                 "members (",
                 change.cause, "): ", r.error(), "; trying again");
      if (r.error().code() != errc::timeout) fail(std::move(r).error());
    }
  }

  void watch_loop() {
    while (!should_stop()) {
      std::uint64_t next = 0;
      {
        std::lock_guard lk(mu);
        if (!beating) return;
        next = current.number + 1;
      }
      // Event-driven: wake when the next epoch is written, at the latest after one interval.
      auto got = s->get(history_key(next), opts.heartbeat_interval);
      if (should_stop()) return;
      if (!got && got.error().code() != errc::timeout) {
        fail(std::move(got).error());
        return;
      }
      if (!catch_up()) return;
      check_heartbeats();
    }
  }
};

service::service(std::shared_ptr<state> st) : state_(std::move(st)) {}

service::~service() { (void)shutdown(state_->opts.op_timeout); }

expected<std::unique_ptr<service>> service::join(std::shared_ptr<store> s, service_options o,
                                                 duration timeout) {
  if (!s) return make_error(errc::invalid_argument, "membership::service::join needs a store");
  if (o.host.empty()) o.host = this_host();
  if (!valid_token(o.name))
    return make_error(errc::invalid_argument,
                      "a member name must be non-empty with no white "
                      "space; got '",
                      o.name, "'");
  if (!valid_token(o.host))
    return make_error(errc::invalid_argument,
                      "a member host must be non-empty with no white "
                      "space; got '",
                      o.host, "'");
  if (o.heartbeat_timeout <= duration::zero()) o.heartbeat_timeout = heartbeat_timeout_from_env();
  if (o.heartbeat_interval <= duration::zero())
    o.heartbeat_interval = heartbeat_interval_from_env(o.heartbeat_timeout);
  if (o.heartbeat_interval >= o.heartbeat_timeout)
    return make_error(
        errc::invalid_argument, "the heartbeat interval (", format_duration(o.heartbeat_interval),
        ") must be shorter than the heartbeat timeout (", format_duration(o.heartbeat_timeout),
        "); check ", settings::heartbeat_interval.variable, " and ",
        settings::heartbeat_timeout.variable);
  auto st = std::make_shared<state>();
  st->s = std::move(s);
  st->opts = std::move(o);
  st->self.name = st->opts.name;
  st->self.host = st->opts.host;
  st->self.pid = static_cast<std::int64_t>(::getpid());
  st->self.incarnation = random_incarnation();
  // Beat once before joining, so that the others' clocks start at a live counter.
  TROUPE_TRY(st->s->add(heartbeat_key(st->self), 1, st->opts.op_timeout));
  epoch_change change;
  change.add.push_back(st->self);
  change.cause =
      strcat("joined: ", st->self.name, " (host ", st->self.host, ", pid ", st->self.pid, ")");
  auto e = apply_change(*st->s, change, timeout);
  if (!e) return std::move(e).error().with_worker(st->self.name);
  const member* me = e->find(st->self.name);
  if (me == nullptr || me->incarnation != st->self.incarnation)
    return make_error(errc::internal, "the epoch that added ", st->self.name, " lacks it");
  st->self.rank = me->rank;
  st->current = std::move(*e);
  TROUPE_LOG(log_level::info, "membership", describe(st->self), " joined epoch ",
             st->current.number, " (", st->current.names(), ")");
  st->heart = std::thread([raw = st.get()] { raw->heartbeat_loop(); });
  st->watcher = std::thread([raw = st.get()] { raw->watch_loop(); });
  return std::unique_ptr<service>(new service(std::move(st)));
}

const member& service::self() const noexcept { return state_->self; }

const service_options& service::options() const noexcept { return state_->opts; }

epoch service::current() const {
  std::lock_guard lk(state_->mu);
  return state_->current;
}

int service::rank() const {
  std::lock_guard lk(state_->mu);
  const member* m = state_->current.find(state_->self.name);
  return m != nullptr && m->incarnation == state_->self.incarnation ? m->rank : -1;
}

expected<epoch> service::wait_until(const std::function<bool(const epoch&)>& predicate,
                                    duration timeout) {
  std::unique_lock lk(state_->mu);
  const bool done = state_->cv.wait_for(lk, timeout, [&] {
    return predicate(state_->current) || state_->sticky.has_value() || state_->stopping;
  });
  if (predicate(state_->current)) return state_->current;
  if (state_->sticky) return *state_->sticky;
  if (state_->stopping)
    return make_error(errc::shut_down, "the membership service of ", state_->self.name,
                      " was shut down while waiting for an epoch");
  (void)done;
  return make_error(errc::timeout, "no wanted epoch within ", format_duration(timeout),
                    "; the latest is epoch ", state_->current.number, " (", state_->current.names(),
                    "; cause: ", state_->current.cause, ")");
}

expected<epoch> service::wait_for_epoch(std::uint64_t number, duration timeout) {
  return wait_until([number](const epoch& e) { return e.number >= number; }, timeout);
}

std::uint64_t service::on_epoch(callback cb) {
  std::lock_guard lk(state_->mu);
  const auto id = state_->next_callback++;
  state_->callbacks.emplace(id, std::move(cb));
  return id;
}

bool service::unsubscribe(std::uint64_t id) {
  std::lock_guard lk(state_->mu);
  return state_->callbacks.erase(id) > 0;
}

expected<epoch> service::declare_dead(std::string_view name, std::string_view reason,
                                      duration timeout) {
  epoch_change change;
  change.remove.push_back({std::string(name), {}});
  // The store's epoch, not this service's view, which may lag behind a join.
  auto latest = read_epoch(*state_->s, timeout);
  epoch seen = latest ? std::move(*latest) : current();
  const member* m = seen.find(name);
  change.cause = strcat("dead: ", m != nullptr ? describe(*m) : std::string(name), ": ", reason,
                        ", seen by ", state_->self.name);
  if (m != nullptr) change.remove.back().incarnation = m->incarnation;
  TROUPE_LOG(log_level::warn, "membership", state_->self.name, " declares ",
             m != nullptr ? describe(*m) : std::string(name), " dead: ", reason);
  return apply_change(*state_->s, change, timeout);
}

expected<void> service::health() const {
  std::lock_guard lk(state_->mu);
  if (state_->sticky) return *state_->sticky;
  return {};
}

expected<void> service::shutdown(duration timeout) {
  auto& st = *state_;
  std::lock_guard guard(st.shutdown_mu);
  if (st.shutdown_result) return *st.shutdown_result;
  expected<void> result;
  bool in = false;
  {
    std::lock_guard lk(st.mu);
    in = !st.sticky && st.current.contains(st.self.name, st.self.incarnation);
    st.leaving = true;
  }
  if (in) {
    epoch_change change;
    change.remove.push_back({st.self.name, st.self.incarnation});
    change.cause = strcat("left: ", describe(st.self));
    auto r = apply_change(*st.s, change, timeout);
    if (!r) result = std::move(r).error().with_worker(st.self.name);
  }
  {
    std::lock_guard lk(st.mu);
    st.stopping = true;
    st.beating = false;
  }
  st.cv.notify_all();
  if (st.heart.joinable()) st.heart.join();
  if (st.watcher.joinable()) st.watcher.join();
  st.shutdown_result = result;
  return result;
}

}  // namespace troupe::membership
