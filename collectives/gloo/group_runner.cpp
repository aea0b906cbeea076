#include <troupe/collectives/gloo/group_runner.hpp>

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include <troupe/collectives/gloo/gloo_errors.hpp>
#include <troupe/collectives/roll_call.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/store/prefix_store.hpp>

namespace troupe::collectives::gloo_runner {

namespace {

// Collectives up to this size are held back from the worker for inline_grace, for their
// waiter to run (see submit()). Up to 1 MiB the hand-off to the worker and back is a
// good part of the operation: world 2 on 2 cores, 7 alternating runs, held up to 4 MiB
// against 64 KiB: allgather 256 KiB and 1 MiB 0.82-0.84x the time, broadcast 256 KiB
// 0.55x (with its ring). At 4 MiB, where the operations copy once (a broadcast in 0.12-0.2
// ms), on a VM whose wake-ups cost more: allgather 0.84x, broadcast 0.74x the time of the
// hand-off, allreduce 0.99x (7 alternating runs); at 16 and 64 MiB the hand-off kept
// 0.85-0.97x the time of the waiter's running them.
constexpr std::size_t small_op_bytes = 4 << 20;
// How long a small collective is left to its waiter, and how often a worker that has had
// operations in the last park_after looks for held ones.
constexpr auto inline_grace = std::chrono::microseconds(500);
constexpr auto park_after = std::chrono::milliseconds(20);
// Once the waiters ran the last inline_streak held collectives themselves, the worker looks
// every slow_poll instead: each look wakes a thread on a CPU that the callers use, and
// preempts one of them for microseconds now and then, which the other members then wait
// for (world 2 on 2 cores, 15 alternating runs of 4-16 KiB operations: 0.87-0.90x the
// time with looks every 5 ms). The price: a held collective that nobody waits for after
// such a streak may start up to slow_poll after its grace, once; the worker's running a
// held one itself ends the streak.
constexpr std::uint32_t inline_streak = 64;
constexpr auto slow_poll = std::chrono::milliseconds(5);

}  // namespace

group_runner::group_runner(const group_spec& spec)
    : process_group(spec),
      store_(std::make_shared<prefix_store>(spec.root_store, spec.name + "/gloo")) {}

group_runner::~group_runner() { shutdown(std::chrono::seconds(30)); }

void group_runner::start(std::shared_ptr<gloo_transport::tcp> tcp,
                         std::shared_ptr<gloo_transport::transport> transport) {
  tcp_ = std::move(tcp);
  transport_ = std::move(transport);
  span_clock::calibrate();  // here, not in the first operation (about 2 ms, once per process)
  // The gauge exists (at 0) from the first group on, not from the first operation that
  // waited in a queue: every export shows it.
  gloo_metrics::queue_depth();
  worker_ = std::thread([this] { run_worker(); });
  p2p_thread_ = std::thread([this] { run_p2p(); });
}

std::optional<troupe::error> group_runner::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

void group_runner::abort(troupe::error why) {
  ring_queue<task> queued;
  std::deque<p2p_wait> posted;
  {
    std::lock_guard lk(mu_);
    if (!failure_) failure_ = std::move(why);
    if (aborted_) return;
    aborted_ = true;
    why = *failure_;
    queued.swap(queue_);
    posted.swap(p2p_queue_);
    // The transfer the p2p thread waits for: its wait returns false at once.
    if (p2p_current_ != nullptr) {
      if (p2p_current_is_send_)
        p2p_current_->abortWaitSend();
      else
        p2p_current_->abortWaitRecv();
    }
    gauge_queue();
  }
  TROUPE_LOG(log_level::info, "collectives", describe(*this), " aborted: ", why.message());
  // The running operation, on the worker or on a waiter, fails as its transport closes.
  {
    std::lock_guard lk(teardown_mu_);
    if (transport_) transport_->abort();
    if (tcp_) tcp_->fail_pairs("the group was aborted: " + why.message());
    break_connections();
  }
  cv_.notify_all();
  p2p_cv_.notify_all();
  idle_cv_.notify_all();
  for (auto& t : queued) t.done.complete(stopped_by(t.what(), why));
  for (auto& w : posted) w.done.complete(stopped_by(w.what, why));
}

void group_runner::shutdown(duration timeout) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  p2p_cv_.notify_all();
  // Queued work fails at once; the running operations get until the deadline, then
  // the connections are closed under them so that they fail promptly.
  bool idle = false;
  {
    std::unique_lock lk(mu_);
    idle = idle_cv_.wait_for(
        lk, timeout, [&] { return !busy_ && !p2p_busy_ && queue_.empty() && p2p_queue_.empty(); });
  }
  if (!idle) {
    std::lock_guard lk(teardown_mu_);
    if (transport_) transport_->abort();
    break_connections();
  }
  if (worker_.joinable()) worker_.join();
  if (p2p_thread_.joinable()) p2p_thread_.join();
  std::lock_guard lk(teardown_mu_);
  transport_.reset();  // the shared memory first, then the TCP pairs and their device
  tcp_.reset();
}

// The error of operation `what` ended by abort(why): why's code, naming the operation.
troupe::error group_runner::stopped_by(const std::string& what, const troupe::error& why) {
  return troupe::error(why.code(), strcat(what, " was stopped: ", why.message()));
}

// Fails every member's operations at once: closes the connections under them and
// marks the shared memory failed.
void group_runner::break_connections() {
  if (transport_) transport_->mark_failed();
}

// Queues an operation. Collectives are numbered in call order, the same on every
// member (the number is the Gloo tag and the roll-call key); point-to-point transfers
// (peer >= 0) have a count of their own, as only two members take part.
//
// A small collective (`bytes` up to small_op_bytes) is held back from the worker for
// inline_grace, so that a caller who waits for it runs it on its own thread (run_inline)
// without waking the worker at all: on a busy host that wake-up (a futex and a context
// switch) costs more than the operation. Nobody waiting, the worker starts it after the
// grace, which starts when the worker first sees it (it looks every inline_grace, or
// slow_poll after a streak); get_future(), is_completed() and a wait() that could not run
// it inline end the grace at once (urge).
// `metric_bytes` is the size the metrics record when `bytes` is not given.
work group_runner::submit(std::string_view op, duration timeout, body_fn body, int peer,
                          std::size_t bytes, std::size_t metric_bytes) {
  std::unique_lock lk(mu_);
  std::uint64_t seq = peer < 0 ? ++seq_ : ++p2p_seq_;
  // The group's description never changes: made once. A collective's work describes
  // itself ("allreduce #4 on ...") only when asked (an error, a log): building the string
  // for every operation was a measurable part of a 4 KiB one. Two string streams per
  // operation were about a sixth of a 4 KiB allreduce at world 2 (5.0 -> 4.2 us).
  if (!description_) description_ = std::make_shared<const std::string>(describe(*this));
  // A collective's waiter may run it itself (run_inline); transfers stay with the worker.
  // Its work describes itself by the hooks' `where`.
  if (!hooks_)
    hooks_ =
        std::make_shared<const work::hooks>(work::hooks{[weak = weak_from_this()](std::uint64_t s) {
                                                          if (auto g = weak.lock())
                                                            g->run_inline(s);
                                                        },
                                                        [weak = weak_from_this()](std::uint64_t s) {
                                                          if (auto g = weak.lock()) g->urge(s);
                                                        },
                                                        *description_});
  auto [w, done] = peer >= 0 ? work::make(strcat(op, " #p", seq, " on ", *description_))
                             : work::make_lazy(op, hooks_, seq);
  if (aborted_) {  // before shut_down: the abort says why the group ended
    auto why = *failure_;
    lk.unlock();
    done.complete(stopped_by(done.description(), why));
    return w;
  }
  if (stopping_) {
    lk.unlock();
    done.complete(make_error(errc::shut_down, done.description(), ": the group was shut down"));
    return w;
  }
  const bool hold = peer < 0 && bytes <= small_op_bytes;
  ++submits_;
  // A held operation's grace starts when the worker first sees it (max until then): no
  // clock read here, on the caller's path of every operation.
  queue_.push_back(task{seq, timeout, std::move(done), std::move(body), peer,
                        hold ? clock::time_point::max() : clock::time_point::min(), op,
                        bytes != SIZE_MAX ? bytes : metric_bytes});
  // An operation the worker must start at once ends the grace of the held ones before it,
  // which run first: they would hold it back.
  if (!hold) {
    for (auto& t : queue_)
      if (t.peer < 0) t.start_by = clock::time_point::min();
    gauge_queue();
  }
  // A polling worker finds a held operation by itself; a parked one must be woken.
  const bool wake = !hold || worker_parked_;
  lk.unlock();
  if (wake) cv_.notify_one();
  return w;
}

// Brings this group's part of the process's queue-depth gauge to the queue's length
// (under mu_). Called where the worker looks and where it must start an operation, not on
// a waiter's path: an operation its waiter runs at once was never waiting to start.
void group_runner::gauge_queue() {
  const auto n = static_cast<std::int64_t>(queue_.size());
  if (n != gauged_) gloo_metrics::queue_depth().add(n - gauged_);
  gauged_ = n;
}

// Ends the grace of collective `seq` and of every one queued before it.
void group_runner::urge(std::uint64_t seq) {
  bool held = false;
  {
    std::lock_guard lk(mu_);
    for (auto& t : queue_) {
      if (t.peer >= 0) continue;
      if (t.seq > seq) break;
      if (t.start_by != clock::time_point::min()) {
        t.start_by = clock::time_point::min();
        held = true;
      }
    }
  }
  if (held) cv_.notify_one();
}

// The worker runs the queued operations in order, one at a time. An operation runs on
// whichever thread takes it first: this worker, or a waiter in run_inline. busy_ (under
// mu_) says one is running; the other never starts another meanwhile, so the group's
// per-operation state (the transport and its scratch) has one user at a time.
void group_runner::run_worker() {
  // Submits seen, and since when none came: the worker parks after park_after of them.
  std::uint64_t seen_submits = 0;
  auto quiet_since = clock::now();
  for (;;) {
    task t;
    {
      std::unique_lock lk(mu_);
      for (;;) {
        if (!busy_ && !queue_.empty()) {
          const auto now = clock::now();
          auto& front = queue_.front();
          if (front.start_by == clock::time_point::max()) front.start_by = now + inline_grace;
          const auto start_by = front.start_by;  // `front` may be taken while this waits
          if (stopping_ || failure_ || start_by <= now) break;
          cv_.wait_until(lk, start_by);  // its waiter may take it meanwhile
          continue;
        }
        // Nothing to start. Between operations (none runs, and none starts while this
        // holds mu_) the metrics are this thread's: their last figures go out before it
        // waits, and the gauge counts what its waiters have not taken.
        gauge_queue();
        if (!busy_) metrics_.flush();
        if (stopping_ && !busy_) return;  // the queue is empty
        // While operations keep coming, poll for held ones instead of asking each submit
        // for a wake-up; after a quiet spell, park.
        const auto now = clock::now();
        if (submits_ != seen_submits) {
          seen_submits = submits_;
          quiet_since = now;
        }
        if (now - quiet_since < park_after) {
          cv_.wait_for(lk, inline_streak_ >= inline_streak ? slow_poll : inline_grace);
        } else {
          worker_parked_ = true;
          cv_.wait(lk);
          worker_parked_ = false;
        }
      }
      t = std::move(queue_.front());
      queue_.pop_front();
      gauge_queue();
      if (t.start_by != clock::time_point::min()) inline_streak_ = 0;  // its waiter did not come
      if (stopping_) {
        lk.unlock();
        t.done.complete(make_error(errc::shut_down, t.what(), ": the group was shut down first"));
        continue;
      }
      if (failure_) {
        auto e = *failure_;
        lk.unlock();
        t.done.complete(make_error(e.code(), t.what(),
                                   " was not run: the group failed earlier: ", e.message()));
        continue;
      }
      busy_ = true;
    }
    execute(t);
  }
}

// Runs collective `seq` on the calling (waiting) thread if it is next in line and nothing
// runs: the caller spares the hand-off to the worker and back, which costs more than a
// small operation itself. Otherwise returns at once and the caller waits as usual.
void group_runner::run_inline(std::uint64_t seq) {
  task t;
  {
    std::lock_guard lk(mu_);
    if (busy_ || stopping_ || failure_ || queue_.empty() || queue_.front().peer >= 0 ||
        queue_.front().seq != seq)
      return;
    t = std::move(queue_.front());
    queue_.pop_front();
    if (inline_streak_ < inline_streak) ++inline_streak_;
    busy_ = true;
  }
  execute(t);
}

// Runs a task taken from the queue with busy_ set, completes its work and clears busy_.
void group_runner::execute(task& t) {
  auto budget = roll_call_budget(t.timeout);
  std::optional<handed_off> handoff;
  // The deadline's start and the time taken for the metrics from the span counter: two
  // reads of clock::now() were a fifth of a group of one's 4 KiB allreduce (span_clock.hpp).
  const auto [started, started_ticks] = stamper_.now();
  run_ctx rc{{static_cast<std::uint32_t>(t.seq & 0xffffffu),
              std::max(t.timeout - budget, duration(1)), t.seq, started},
             t.peer >= 0 ? &handoff : nullptr};
  trace::span traced("collectives", t.op);
  if (traced.on()) {
    traced.args()
        .add("group", spec().name)
        .add(t.peer >= 0 ? "p2p_seq" : "seq", t.seq)
        .add("transport", transport_->carrier(t.op, t.bytes))
        .add("rank", rank())
        .add("size", size());
    if (t.bytes != SIZE_MAX) traced.args().add("bytes", static_cast<std::uint64_t>(t.bytes));
    if (t.peer >= 0)
      traced.args().add("peer", spec().global_ranks[static_cast<std::size_t>(t.peer)]);
  }
  // The transports return their errors; the guard catches what the group's own steps
  // might still throw (an allocation), so that it too becomes the sticky error.
  if (auto r = gloo_errors::guard([&] { return t.body(rc); }); !r) {
    fail_group(t, r.error(), budget);
  } else if (handoff) {
    std::lock_guard lk(mu_);
    p2p_queue_.push_back(p2p_wait{t.what(), std::move(handoff->buffer), handoff->is_send,
                                  handoff->peer, clock::now() + handoff->timeout, t.timeout,
                                  t.done});
    p2p_cv_.notify_one();
  } else {
    if (t.peer < 0) {
      metrics_.record(t.op, t.bytes, span_clock::between(started_ticks, span_clock::ticks()),
                      started);
    }
    t.done.complete(ok());
  }
  bool more = false, stopping = false;
  {
    std::lock_guard lk(mu_);
    busy_ = false;
    more = !queue_.empty();
    stopping = stopping_;
  }
  if (more || stopping) cv_.notify_one();  // the next operation, or the worker's exit
  if (stopping) idle_cv_.notify_all();
}

// Records the sticky error, closes every connection so that peers still inside the
// operation fail at once too, then asks the store which ranks reached this point.
void group_runner::fail_group(task& t, const troupe::error& cause, duration budget) {
  {
    std::unique_lock lk(mu_);
    if (aborted_) {
      // Stopped on purpose: the abort's error, without asking who arrived.
      auto why = *failure_;
      lk.unlock();
      t.done.complete(stopped_by(t.what(), why));
      return;
    }
  }
  break_connections();
  auto missing =
      t.peer >= 0
          ? std::optional(std::vector<int>{spec().global_ranks[static_cast<std::size_t>(t.peer)]})
          : roll_call(*store_, spec(), t.seq, budget);
  auto e = make_error(cause.code(), t.what(), " failed (timeout ", format_duration(t.timeout),
                      "): ", describe_missing(missing), "; ", cause.message());
  {
    std::lock_guard lk(mu_);
    if (!failure_) failure_ = e;
  }
  TROUPE_LOG(log_level::warn, "collectives", e.message());
  t.done.complete(e);
}

void group_runner::run_p2p() {
  for (;;) {
    p2p_wait w;
    {
      std::unique_lock lk(mu_);
      p2p_cv_.wait(lk, [&] { return stopping_ || !p2p_queue_.empty(); });
      if (p2p_queue_.empty()) return;
      w = std::move(p2p_queue_.front());
      p2p_queue_.pop_front();
      p2p_busy_ = true;
      if (aborted_) {
        auto why = *failure_;
        p2p_busy_ = false;
        lk.unlock();
        w.done.complete(stopped_by(w.what, why));
        idle_cv_.notify_all();
        continue;
      }
      p2p_current_ = w.buffer.get();
      p2p_current_is_send_ = w.is_send;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - clock::now());
    left = std::max(left, std::chrono::milliseconds(1));
    bool done = false;
    auto waited = gloo_errors::guard(
        [&] { done = w.is_send ? w.buffer->waitSend(left) : w.buffer->waitRecv(left); });
    if (waited && !done)  // abort() ended the wait
      waited = troupe::error(errc::connection_lost, "gloo: the transfer was aborted");
    if (waited) {
      w.done.complete(ok());
    } else {
      const auto& cause = waited.error();
      std::unique_lock lk(mu_);
      p2p_current_ = nullptr;
      if (aborted_) {
        auto why = *failure_;
        lk.unlock();
        w.done.complete(stopped_by(w.what, why));
        {
          // Not while abort() fails the pairs: Gloo may still signal this buffer there.
          std::lock_guard td(teardown_mu_);
          w.buffer.reset();
        }
        lk.lock();
        p2p_busy_ = false;
        lk.unlock();
        idle_cv_.notify_all();
        continue;
      }
      lk.unlock();
      break_connections();
      int peer = spec().global_ranks[static_cast<std::size_t>(w.peer)];
      auto e = make_error(cause.code(), w.what, " failed (timeout ", format_duration(w.timeout),
                          "): rank ", format_ranks({peer}), " did not arrive; ", cause.message());
      lk.lock();
      if (!failure_) failure_ = e;
      lk.unlock();
      w.done.complete(e);
    }
    {
      std::lock_guard lk(mu_);
      p2p_current_ = nullptr;
    }
    w.buffer.reset();
    {
      std::lock_guard lk(mu_);
      p2p_busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace troupe::collectives::gloo_runner
