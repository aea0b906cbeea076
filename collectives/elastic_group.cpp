// elastic_group: one backend group per epoch, the old one aborted when the epoch moves.
// Threads: on_epoch runs on the membership watcher and only aborts and releases; rebuild()
// runs on the caller's thread; the hold thread ends held works at their grace. No lock is
// held while calling a group, a work's completion or the service.
#include <troupe/collectives/elastic_group.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <troupe/collectives/comm_plan.hpp>
#include <troupe/collectives/communicator_carry.hpp>
#include <troupe/collectives/interruptible_store.hpp>
#include <troupe/collectives/registry.hpp>
#include <troupe/core/codec.hpp>
#include <troupe/core/log.hpp>
#include <troupe/store/key_ledger.hpp>

namespace troupe::collectives {

namespace {

using epoch_ptr = std::shared_ptr<const membership::epoch>;

// "this worker, worker3 (...), is not in epoch 7: <what changed>".
troupe::error not_in_epoch(const membership::member& self, const membership::epoch& before,
                           const membership::epoch& after) {
  return make_error(errc::membership_changed, "this worker, ", membership::describe(self),
                    ", is not in epoch ", after.number, ": ",
                    membership::membership_changed_error(before, after).message());
}

bool holds(const membership::epoch& e, const membership::member& self) {
  return e.contains(self.name, self.incarnation);
}

// Whether a member of `built` is not in `now` (it died or left since).
bool lost_a_member(const membership::epoch& built, const membership::epoch& now) {
  return std::any_of(built.members.begin(), built.members.end(),
                     [&](const membership::member& m) { return !holds(now, m); });
}

}  // namespace

// A work that failed because its group broke, held until the epoch that explains it.
struct held_work {
  work::completer done;
  troupe::error cause;
  epoch_ptr epoch;
  clock::time_point until;
};

struct elastic_group::state {
  std::shared_ptr<membership::service> members;
  std::shared_ptr<store> root;
  elastic_options opts;
  std::uint64_t subscription = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  membership::epoch newest;                // the newest epoch known
  epoch_ptr built_epoch;                   // the epoch of `built`
  std::shared_ptr<process_group> built;    // what current() hands out (an epoch_group)
  std::shared_ptr<process_group> backend;  // the backend group inside `built`
  std::vector<held_work> holding;
  // The keys each epoch's build wrote through this process (commit, carry agreement, the
  // backend's connection records), erased once a later epoch's group is built: by then
  // every member of that epoch is past the older builds (docs/membership.md).
  std::vector<std::pair<std::uint64_t, std::shared_ptr<key_ledger>>> ledgers;
  bool stopping = false;
  std::thread hold_thread;

  // The error of work of `group_epoch` once `now` is known: `now` moved past it.
  troupe::error changed(const membership::epoch& group_epoch, const membership::epoch& now) const {
    if (!holds(now, members->self())) return not_in_epoch(members->self(), group_epoch, now);
    return membership::membership_changed_error(group_epoch, now);
  }

  // A work of the group of `e` failed with `cause`; `broken`: its group has failed.
  void settle(const work::completer& done, troupe::error cause, const epoch_ptr& e, bool broken) {
    if (cause.code() == errc::membership_changed || !broken) {
      done.complete(std::move(cause));
      return;
    }
    std::unique_lock lk(mu);
    if (newest.number > e->number) {
      auto why = changed(*e, newest);
      lk.unlock();
      done.complete(explained(cause, why));
      return;
    }
    if (stopping) {
      lk.unlock();
      done.complete(std::move(cause));
      return;
    }
    holding.push_back({done, std::move(cause), e, clock::now() + opts.grace});
    lk.unlock();
    cv.notify_all();
  }

  // membership_changed, saying what the work met first.
  static troupe::error explained(const troupe::error& cause, const troupe::error& why) {
    return troupe::error(errc::membership_changed,
                         strcat(cause.message(), "; then ", why.message()));
  }

  // The service's watcher: a new epoch aborts the group of the old one and releases the
  // works held for it.
  void on_epoch(const membership::epoch& after) {
    std::shared_ptr<process_group> old;
    epoch_ptr old_epoch;
    std::vector<held_work> released;
    {
      std::lock_guard lk(mu);
      if (after.number <= newest.number) return;
      newest = after;
      old = backend;
      old_epoch = built_epoch;
      released.swap(holding);
    }
    cv.notify_all();
    if (old) {
      auto why = changed(*old_epoch, after);
      // Retired rather than aborted: pending work fails at once all the same, and a backend
      // that can shrink its communicator (nccl) keeps it for the next epoch's group.
      TROUPE_LOG(log_level::info, "collectives", "retiring ", describe(*old), ": ", why.message());
      old->retire(std::move(why));
    }
    for (auto& h : released) h.done.complete(explained(h.cause, changed(*h.epoch, after)));
  }

  // The hold thread: ends held works whose grace passed with their own error.
  void run_holds() {
    std::unique_lock lk(mu);
    for (;;) {
      std::vector<held_work> expired;
      const auto now = clock::now();
      auto next = clock::time_point::max();
      for (auto it = holding.begin(); it != holding.end();) {
        if (stopping || it->until <= now) {
          expired.push_back(std::move(*it));
          it = holding.erase(it);
        } else {
          next = std::min(next, it->until);
          ++it;
        }
      }
      if (!expired.empty()) {
        lk.unlock();
        for (auto& h : expired)
          h.done.complete(
              troupe::error(h.cause.code(), strcat(h.cause.message(), "; no new epoch came within ",
                                                   format_duration(opts.grace), " of it")));
        lk.lock();
        continue;
      }
      if (stopping) return;
      if (next == clock::time_point::max())
        cv.wait(lk);
      else
        cv.wait_until(lk, next);
    }
  }
};

namespace {

// The group handed out for one epoch: the backend's group, whose works that fail because
// the group broke are settled by the elastic group's state (held for the next epoch).
class epoch_group final : public process_group {
 public:
  epoch_group(std::shared_ptr<process_group> inner, epoch_ptr e,
              std::weak_ptr<elastic_group::state> st)
      : process_group(inner->spec()),
        inner_(std::move(inner)),
        epoch_(std::move(e)),
        state_(std::move(st)) {}

  std::string_view backend_name() const noexcept override { return inner_->backend_name(); }
  bool supports(dtype t, reduce_op op) const noexcept override { return inner_->supports(t, op); }

  work allreduce(tensor_view t, const allreduce_options& o) override {
    return follow(inner_->allreduce(t, o));
  }
  work broadcast(tensor_view t, const broadcast_options& o) override {
    return follow(inner_->broadcast(t, o));
  }
  work reduce(tensor_view t, const reduce_options& o) override {
    return follow(inner_->reduce(t, o));
  }
  work allgather(tensor_view in, tensor_view out, const allgather_options& o) override {
    return follow(inner_->allgather(in, out, o));
  }
  work gather(tensor_view in, tensor_view out, const gather_options& o) override {
    return follow(inner_->gather(in, out, o));
  }
  work scatter(tensor_view in, tensor_view out, const scatter_options& o) override {
    return follow(inner_->scatter(in, out, o));
  }
  work reduce_scatter(tensor_view in, tensor_view out, const reduce_scatter_options& o) override {
    return follow(inner_->reduce_scatter(in, out, o));
  }
  work all_to_all(tensor_view in, tensor_view out, const all_to_all_options& o) override {
    return follow(inner_->all_to_all(in, out, o));
  }
  work barrier(const barrier_options& o) override { return follow(inner_->barrier(o)); }
  work send(tensor_view t, int dst, const p2p_options& o) override {
    return follow(inner_->send(t, dst, o));
  }
  work recv(tensor_view t, int src, const p2p_options& o) override {
    return follow(inner_->recv(t, src, o));
  }

  std::optional<troupe::error> failure() const override { return inner_->failure(); }
  void abort(troupe::error why) override { inner_->abort(std::move(why)); }
  void shutdown(duration timeout) override { inner_->shutdown(timeout); }

 private:
  // A work that completes as `w` does, except that a failure of the broken group waits
  // for the next epoch (up to the grace) and then says the membership changed.
  work follow(work w) {
    // Waiting on the result runs the operation on the waiter's thread where it can.
    auto [out, done] = work::make(w.description(), [w] { (void)w.wait(duration::zero()); });
    std::weak_ptr<process_group> inner = inner_;
    w.get_future().on_complete([done = done, inner, e = epoch_, st = state_](expected<void>&& r) {
      if (r) {
        done.complete(ok());
        return;
      }
      auto g = inner.lock();
      const bool broken = g && g->failure().has_value();
      if (auto s = st.lock())
        s->settle(done, std::move(r).error(), e, broken);
      else
        done.complete(std::move(r).error());
    });
    return out;
  }

  std::shared_ptr<process_group> inner_;
  epoch_ptr epoch_;
  std::weak_ptr<elastic_group::state> state_;
};

}  // namespace

expected<std::unique_ptr<elastic_group>> elastic_group::make(
    std::shared_ptr<membership::service> members, std::shared_ptr<store> s, elastic_options o) {
  if (!members)
    return make_error(errc::invalid_argument,
                      "elastic_group needs a membership service; join one first "
                      "(membership::service::join)");
  if (!s) return make_error(errc::invalid_argument, "elastic_group needs the job's store");
  if (o.name.empty())
    return make_error(errc::invalid_argument,
                      "elastic_group needs a name: the prefix of its groups' keys in the store");
  if (auto b = find_backend(o.backend.empty() ? default_backend() : o.backend); !b)
    return std::move(b).error().with_operation("collectives.elastic_group");
  if (o.build_timeout <= duration::zero())
    return make_error(errc::invalid_argument, "elastic_group: the build timeout must be positive");
  if (o.grace <= duration::zero())
    o.grace = members->options().heartbeat_timeout + 2 * members->options().heartbeat_interval +
              std::chrono::seconds(1);
  auto st = std::make_shared<state>();
  st->members = members;
  st->root = std::move(s);
  st->opts = std::move(o);
  std::weak_ptr<state> weak = st;
  st->subscription =
      members->on_epoch([weak](const membership::epoch&, const membership::epoch& e) {
        if (auto alive = weak.lock()) alive->on_epoch(e);
      });
  // Subscribed first, then read: whichever is newer wins (service::on_epoch says why).
  st->on_epoch(members->current());
  st->hold_thread = std::thread([raw = st.get()] { raw->run_holds(); });
  return std::unique_ptr<elastic_group>(new elastic_group(std::move(st)));
}

elastic_group::elastic_group(std::shared_ptr<state> st) : state_(std::move(st)) {}

elastic_group::~elastic_group() { shutdown(std::chrono::seconds(5)); }

elastic_group::view elastic_group::current() const {
  std::lock_guard lk(state_->mu);
  view v;
  if (state_->built_epoch) v.epoch = *state_->built_epoch;
  v.group = state_->built;
  return v;
}

membership::epoch elastic_group::latest() const {
  std::lock_guard lk(state_->mu);
  return state_->newest;
}

expected<membership::epoch> elastic_group::wait_for_change(std::uint64_t than, duration timeout) {
  auto& st = *state_;
  {
    std::unique_lock lk(st.mu);
    st.cv.wait_for(lk, timeout, [&] { return st.stopping || st.newest.number > than; });
    if (st.newest.number > than) return st.newest;
    if (st.stopping)
      return make_error(errc::shut_down, "the elastic group '", st.opts.name, "' was shut down");
  }
  if (auto h = st.members->health(); !h) return std::move(h).error();
  return make_error(errc::timeout, "no epoch after ", than, " within ", format_duration(timeout));
}

namespace {

// "<name>/epoch-<n>/commit/": the keys of epoch `e`'s commit step.
std::string commit_prefix(const elastic_group::state& st, const membership::epoch& e) {
  return strcat(st.opts.name, "/epoch-", e.number, "/commit/");
}

// This member's offer to carry its communicator into epoch `e`'s group (communicator_carry.hpp).
carry_offer make_offer(elastic_group::state& st, const membership::epoch& e,
                       const std::string& group_name);

// The all-or-none agreement before building epoch `e`'s group, over the root store under
// `<name>/epoch-<n>/commit/`: every member adds itself to `arrived`; the one that makes it
// the epoch's size sets `state` to "built" (compare_set from absent), and a member that
// learns of a newer epoch while waiting sets it to "cancelled" the same way. Exactly one of
// the two wins, so every member sees the same answer: true (build, and do not abandon),
// false (a newer epoch: go to it). Waits in slices of 50 ms, up to the build timeout.
// Before arriving, a member publishes its offer to carry its communicator over
// (publish_carry), so that every offer is counted once the decision is made.
expected<bool> commit_build(elastic_group::state& st, store& s, const membership::epoch& e,
                            int rank, const carry_offer& offer, const deadline& dl);

// Erases the keys of the builds of epochs before `n`, best effort (a key left behind is
// only litter); logs what it could not.
void erase_older_builds(elastic_group::state& st, std::uint64_t n);

}  // namespace

expected<elastic_group::view> elastic_group::rebuild(duration timeout) {
  auto& st = *state_;
  const auto dl = deadline::after(timeout);
  const auto& self = st.members->self();
  for (;;) {
    membership::epoch e;
    {
      std::lock_guard lk(st.mu);
      if (st.stopping)
        return make_error(errc::shut_down, "the elastic group '", st.opts.name, "' was shut down");
      e = st.newest;
      if (st.built && st.built_epoch->number == e.number) return view{e, st.built};
    }
    if (auto h = st.members->health(); !h) return std::move(h).error();
    const auto* me = e.find(self.name);
    if (me == nullptr || me->incarnation != self.incarnation)
      return make_error(errc::membership_changed, "this worker, ", membership::describe(self),
                        ", is not in epoch ", e.number, " (", e.names(),
                        "); it cannot build that epoch's group");
    if (dl.expired())
      return make_error(errc::timeout, "the group of epoch ", e.number, " was not built within ",
                        format_duration(timeout));
    // All or none: the members first agree that every one of them builds this epoch's
    // group; once they have, nobody abandons the build for a newer epoch (a member that
    // published its connection keys and then left would hold the others in gloo's pair
    // connect until the build timeout). See commit_build().
    const std::string group_name = strcat(st.opts.name, "/epoch-", e.number);
    const auto offer = make_offer(st, e, group_name);
    auto ledger = std::make_shared<key_ledger>(st.root);
    {
      std::lock_guard lk(st.mu);
      st.ledgers.emplace_back(e.number, ledger);
    }
    auto committed = commit_build(st, *ledger, e, me->rank, offer, dl);
    if (!committed) return std::move(committed).error();
    if (!*committed) continue;  // a newer epoch came first: build that one
    group_spec spec;
    spec.name = group_name;
    spec.rank = me->rank;
    spec.size = static_cast<int>(e.size());
    for (int r = 0; r < spec.size; ++r) spec.global_ranks.push_back(r);
    const std::uint64_t n = e.number;
    std::weak_ptr<state> weak = state_;
    // Committed, the build is interrupted by a shutdown, and by a newer epoch without one
    // of this epoch's members (dead or gone: the build cannot complete, and every member
    // learns of that epoch, so all of them stop); a newer epoch that only adds members
    // makes the built group stale (below) instead. The check interrupts the store's waits
    // and the backend's connect alike.
    auto interrupt = [weak, ep = std::make_shared<const membership::epoch>(
                                e)]() -> std::optional<troupe::error> {
      auto s = weak.lock();
      if (!s) return make_error(errc::shut_down, "the elastic group is gone");
      std::lock_guard lk(s->mu);
      if (s->stopping) return make_error(errc::shut_down, "the elastic group was shut down");
      if (s->newest.number > ep->number && lost_a_member(*ep, s->newest))
        return s->changed(*ep, s->newest);
      return std::nullopt;
    };
    spec.root_store = std::make_shared<interruptible_store>(ledger, interrupt);
    spec.interrupt = interrupt;
    spec.timeout = std::min(st.opts.build_timeout, dl.remaining());
    const auto started = clock::now();
    expected<std::shared_ptr<process_group>> g = std::shared_ptr<process_group>();
    carry_agreement agreed;
    if (offer.plan) {
      auto a = agree_carry(*ledger, commit_prefix(st, e), e, offer,
                           std::max(std::min(dl.remaining(), st.opts.build_timeout), duration(1)));
      if (!a) return std::move(a).error();
      agreed = *a;
    }
    if (agreed.all) {
      auto plan = *offer.plan;
      plan.abort_first = agreed.abort_first;
      TROUPE_LOG(log_level::info, "collectives", describe(*offer.prev), ": ", describe(plan));
      g = offer.prev->rebuild_native(spec, plan);
      if (g && !*g)
        g = make_error(errc::internal, describe(*offer.prev), " agreed to ", to_string(plan.action),
                       " its communicator but has no native rebuild");
    } else {
      if (offer.plan) {
        // Every member re-creates; the old communicator goes first.
        TROUPE_LOG(offer.offers ? log_level::info : log_level::warn, "collectives",
                   describe(*offer.prev), ": epoch ", offer.from->number, " -> ", e.number,
                   ": recreate (",
                   offer.offers ? strcat("only ", agreed.offered, " of ", e.size(),
                                         " members can carry the communicator of epoch ",
                                         offer.from->number, " over")
                                : offer.plan->reason,
                   ")");
        offer.prev->abort(offer.prev->failure().value_or(st.changed(*offer.from, e)));
      }
      g = create_group(st.opts.backend, spec);
    }
    if (g) {
      auto ep = std::make_shared<const membership::epoch>(e);
      auto wrapped = std::make_shared<epoch_group>(*g, ep, state_);
      std::shared_ptr<process_group> old;
      std::optional<troupe::error> stale;
      {
        std::lock_guard lk(st.mu);
        if (st.stopping) {
          stale = make_error(errc::shut_down, "the elastic group was shut down");
        } else if (st.newest.number != n) {
          stale = st.changed(e, st.newest);
        } else {
          old = std::move(st.backend);
          st.backend = *g;
          st.built = wrapped;
          st.built_epoch = ep;
        }
      }
      if (stale) {  // the epoch moved during the build: this group is already over
        (*g)->abort(*stale);
        (*g)->shutdown(std::chrono::seconds(2));
        continue;
      }
      if (old) old->shutdown(std::chrono::seconds(2));  // aborted when the epoch moved
      erase_older_builds(st, n);
      TROUPE_LOG(log_level::info, "collectives", "built ", describe(*wrapped), " for epoch ", n,
                 " (", e.names(), ") in ",
                 format_duration(std::chrono::duration_cast<duration>(clock::now() - started)));
      return view{e, wrapped};
    }
    auto why = std::move(g).error();
    std::uint64_t newer = 0;
    {
      std::lock_guard lk(st.mu);
      if (st.newest.number > n) newer = st.newest.number;
    }
    if (newer != 0) {  // build the newer epoch instead
      TROUPE_LOG(log_level::info, "collectives", "the build of epoch ", n, "'s group ended (",
                 why.message(), "); building epoch ", newer, " instead");
      continue;
    }
    // A member may have died during the build: wait for the epoch that says so.
    auto next = wait_for_change(n, std::min(st.opts.grace, dl.remaining()));
    if (next) continue;
    return make_error(why.code(), "building the group of epoch ", n, " (", e.names(), ") as rank ",
                      spec.rank, " failed: ", why.message());
  }
}

void elastic_group::shutdown(duration timeout) {
  auto& st = *state_;
  std::shared_ptr<process_group> backend;
  {
    std::lock_guard lk(st.mu);
    if (st.stopping) return;
    st.stopping = true;
    backend = st.backend;
  }
  st.cv.notify_all();
  st.members->unsubscribe(st.subscription);
  const auto dl = deadline::after(timeout);
  if (backend) {
    backend->abort(
        make_error(errc::shut_down, "the elastic group '", st.opts.name, "' was shut down"));
    backend->shutdown(dl.remaining());
  }
  if (st.hold_thread.joinable()) st.hold_thread.join();
}

namespace {

carry_offer make_offer(elastic_group::state& st, const membership::epoch& e,
                       const std::string& group_name) {
  std::shared_ptr<process_group> prev;
  epoch_ptr from;
  {
    std::lock_guard lk(st.mu);
    prev = st.backend;
    from = st.built_epoch;
  }
  return make_carry_offer(std::move(prev), std::move(from), e, group_name);
}

expected<bool> commit_build(elastic_group::state& st, store& s, const membership::epoch& e,
                            int rank, const carry_offer& offer, const deadline& dl) {
  const std::string base = commit_prefix(st, e);
  const std::string state_key = base + "state";
  const auto until = deadline::after(std::min(dl.remaining(), st.opts.build_timeout));
  const auto left = [&] { return std::max(until.remaining(), duration(1)); };
  const auto decided = [](const bytes& b) {
    return troupe::to_string(std::span<const std::byte>(b)) == "built";
  };
  TROUPE_TRY(publish_carry(s, base, offer, left()));
  auto arrived = s.add(base + "arrived", 1, left());
  if (!arrived) return std::move(arrived).error();
  if (*arrived == static_cast<std::int64_t>(e.size())) {
    auto won = s.compare_set(state_key, std::nullopt, to_bytes(std::string("built")), left());
    if (!won) return std::move(won).error();
    return decided(*won);
  }
  for (;;) {
    auto got = s.get(state_key, std::min(left(), duration(50)));
    if (got) return decided(*got);
    if (got.error().code() != errc::timeout) return std::move(got).error();
    bool newer = false;
    {
      std::lock_guard lk(st.mu);
      if (st.stopping)
        return make_error(errc::shut_down, "the elastic group '", st.opts.name, "' was shut down");
      newer = st.newest.number > e.number;
    }
    if (newer) {
      auto won = s.compare_set(state_key, std::nullopt, to_bytes(std::string("cancelled")), left());
      if (!won) return std::move(won).error();
      return decided(*won);
    }
    if (until.expired())
      return make_error(errc::timeout, "building the group of epoch ", e.number, " (", e.names(),
                        ") as rank ", rank, ": only ", *arrived, " of ", e.size(),
                        " members (counting this one) arrived within the build timeout; are "
                        "the others alive and following the same membership?");
  }
}

void erase_older_builds(elastic_group::state& st, std::uint64_t n) {
  std::vector<std::shared_ptr<key_ledger>> old;
  {
    std::lock_guard lk(st.mu);
    for (auto it = st.ledgers.begin(); it != st.ledgers.end();) {
      if (it->first < n) {
        old.push_back(std::move(it->second));
        it = st.ledgers.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& l : old)
    if (auto r = l->erase_written(std::chrono::seconds(1)); !r)
      TROUPE_LOG(log_level::debug, "collectives", "could not erase the keys of an older build of '",
                 st.opts.name, "': ", r.error().message());
}

}  // namespace

}  // namespace troupe::collectives
