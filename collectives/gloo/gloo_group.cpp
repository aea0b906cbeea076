// Why this file is long (~760 lines): it is the group's lifecycle, whose parts share one
// mutex, the task queue and the sticky error: the connect sequence (the transport is
// chosen there, once), the two threads, the inline path for small waited-for operations,
// the failure path (roll call, connections broken, waiters told), and each operation's
// checks and hand-off to the transport. How data moves is in the transports
// (transport.hpp: tcp_transport, shm_transport, hier_transport) and their algorithms
// (direct, shared_memory, hierarchical); what needs no group state has its own file
// (member_addresses, group_metrics, full_mesh, os_tuning, gloo_errors).
// The gloo process group. Threading: one worker thread per group runs the collectives in
// call order through the transport it chose at connect (transport.hpp); a second thread
// waits for point-to-point transfers, which the worker only posts, so that a send and a
// recv posted back to back cannot deadlock. A failed operation's error (Gloo's exceptions
// turned into errors in gloo_errors::guard) becomes the group's sticky error on these
// threads; nothing is thrown to the caller.
#include "collectives/gloo/gloo_group.hpp"

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "collectives/gloo/cpu_reduce.hpp"
#include "collectives/gloo/gloo_errors.hpp"
#include "collectives/gloo/group_metrics.hpp"
#include "collectives/gloo/hier_transport.hpp"
#include "collectives/gloo/member_addresses.hpp"
#include "collectives/gloo/os_tuning.hpp"
#include "collectives/gloo/shm_transport.hpp"
#include "collectives/gloo/tcp_transport.hpp"
#include "collectives/interruptible_store.hpp"
#include "collectives/op_checks.hpp"
#include "collectives/roll_call.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"
#include "core/trace.hpp"
#include "store/prefix_store.hpp"

namespace troupe::collectives {

namespace {

// Collectives up to this size are held back from the worker for inline_grace, for their
// waiter to run (see submit()). Larger ones take long enough that a wake-up is noise.
constexpr std::size_t small_op_bytes = 64 << 10;
// How long a small collective is left to its waiter, and how often a worker that has had
// operations in the last park_after looks for held ones.
constexpr auto inline_grace = std::chrono::microseconds(500);
constexpr auto park_after = std::chrono::milliseconds(20);

class gloo_group final : public process_group, public std::enable_shared_from_this<gloo_group> {
 public:
  explicit gloo_group(const group_spec& spec)
      : process_group(spec),
        store_(std::make_shared<prefix_store>(spec.root_store, spec.name + "/gloo")) {}

  ~gloo_group() override { shutdown(std::chrono::seconds(30)); }

  expected<void> connect() {
    gloo_os::ignore_sigpipe_once();
    // The setup's store waits end when the spec's interrupt says so (as does the mesh's
    // pair connect, through gloo_mesh); later ones (roll calls) are bounded by timeouts.
    std::shared_ptr<store> setup = store_;
    if (spec().interrupt)
      setup = std::make_shared<prefix_store>(
          std::make_shared<interruptible_store>(spec().root_store, spec().interrupt),
          spec().name + "/gloo");
    auto host = choose_address(*setup, *this, choices_);
    if (!host) return std::move(host).error().with_operation("collectives.gloo.connect");
    gloo_transport::tcp_options to;
    to.rank = rank();
    to.size = size();
    to.host = *host;
    to.timeout = spec().timeout;
    to.rendezvous = std::make_shared<prefix_store>(setup, "connect");
    to.interrupt = spec().interrupt;
    auto tcp = gloo_transport::tcp::connect(to);
    if (!tcp) {
      const auto& e = tcp.error();
      return make_error(e.code(), "connecting the members of ", describe(*this), " within ",
                        format_duration(spec().timeout), " failed: ", e.message())
          .with_operation("collectives.gloo.connect");
    }
    tcp_ = std::move(*tcp);
    transport_ = tcp_;
    if (auto c = choose_transport(setup); !c) return std::move(c).error();
    TROUPE_LOG(log_level::debug, "collectives", describe(*this), " runs its collectives over ",
               transport_->name());
    worker_ = std::thread([this] { run_worker(); });
    p2p_thread_ = std::thread([this] { run_p2p(); });
    return ok();
  }

  // The group's transport, once: the hierarchical one when the members span hosts, some
  // host has two or more of them and none turned it off; else shared memory when the
  // members share it; else TCP (transport_ already).
  expected<void> choose_transport(const std::shared_ptr<store>& setup) {
    gloo_hier::open_options ho;
    ho.rank = rank();
    ho.world_ranks = spec().global_ranks;
    ho.group = describe(*this);
    ho.timeout = spec().timeout;
    auto hier = gloo_transport::open_hierarchical(std::make_shared<prefix_store>(setup, "hier"),
                                                  choices_, ho, tcp_);
    if (!hier)
      return make_error(hier.error().code(), "setting up shared memory within the hosts of ",
                        describe(*this), " failed: ", hier.error().message())
          .with_operation("collectives.gloo.connect");
    if (*hier) {
      transport_ = std::move(*hier);
      return ok();
    }
    gloo_shm::open_options so;
    so.rank = rank();
    so.size = size();
    so.world_ranks = spec().global_ranks;
    so.group = describe(*this);
    so.timeout = spec().timeout;
    prefix_store shm_store(setup, "shm");
    auto shm = gloo_transport::open_shared_memory(shm_store, so, tcp_);
    if (!shm)
      return make_error(shm.error().code(), "setting up shared memory between the members of ",
                        describe(*this), " failed: ", shm.error().message())
          .with_operation("collectives.gloo.connect");
    if (*shm) transport_ = std::move(*shm);
    return ok();
  }

  std::string_view backend_name() const noexcept override { return "gloo"; }
  bool supports(dtype type, reduce_op op) const noexcept override { return cpu_supports(type, op); }

  work allreduce(tensor_view t, const allreduce_options& o) override {
    if (auto c = check(t, "allreduce"); !c) return failed(c);
    if (auto c = check_reduce(*this, t, o.op, "allreduce"); !c) return failed(c);
    auto fn = *cpu_reduce(t.type, o.op);
    return submit(
        "allreduce", o.timeout,
        [this, t, fn, op = o.op](const run_ctx& rc) -> expected<void> {
          if (t.numel == 0) return ok();
          TROUPE_TRY(transport_->allreduce(rc.step, t, op, fn));
          if (op == reduce_op::avg) cpu_divide(t, static_cast<std::size_t>(size()));
          return ok();
        },
        -1, t.nbytes());
  }

  work broadcast(tensor_view t, const broadcast_options& o) override {
    if (auto c = check(t, "broadcast"); !c) return failed(c);
    if (auto c = check_root(*this, o.root, "broadcast"); !c) return failed(c);
    return submit(
        "broadcast", o.timeout,
        [this, t, root = o.root](const run_ctx& rc) -> expected<void> {
          if (t.numel == 0 || size() == 1) return ok();
          return transport_->broadcast(rc.step, t, root);
        },
        -1, t.nbytes());
  }

  work reduce(tensor_view t, const reduce_options& o) override {
    if (auto c = check(t, "reduce"); !c) return failed(c);
    if (auto c = check_root(*this, o.root, "reduce"); !c) return failed(c);
    if (auto c = check_reduce(*this, t, o.op, "reduce"); !c) return failed(c);
    auto fn = *cpu_reduce(t.type, o.op);
    return submit(
        "reduce", o.timeout,
        [this, t, fn, o](const run_ctx& rc) -> expected<void> {
          if (t.numel == 0) return ok();
          TROUPE_TRY(transport_->reduce(rc.step, t, o.root, fn));
          if (o.op == reduce_op::avg && rank() == o.root)
            cpu_divide(t, static_cast<std::size_t>(size()));
          return ok();
        },
        -1, SIZE_MAX, t.nbytes());
  }

  work allgather(tensor_view in, tensor_view out, const allgather_options& o) override {
    if (auto c = check(in, "allgather input"); !c) return failed(c);
    if (auto c = check(out, "allgather output"); !c) return failed(c);
    if (auto c = check_blocks(*this, in, out, true, "allgather"); !c) return failed(c);
    return submit(
        "allgather", o.timeout,
        [this, in, out](const run_ctx& rc) -> expected<void> {
          if (in.numel == 0) return ok();
          return transport_->allgather(rc.step, in, out);
        },
        -1, out.nbytes());
  }

  work gather(tensor_view in, tensor_view out, const gather_options& o) override {
    bool is_root = rank() == o.root;
    if (auto c = check(in, "gather input"); !c) return failed(c);
    if (auto c = check_root(*this, o.root, "gather"); !c) return failed(c);
    if (is_root)
      if (auto c = check(out, "gather output"); !c) return failed(c);
    if (auto c = check_blocks(*this, in, out, is_root, "gather"); !c) return failed(c);
    return submit(
        "gather", o.timeout,
        [this, in, out, root = o.root](const run_ctx& rc) -> expected<void> {
          if (in.numel == 0) return ok();
          return transport_->gather(rc.step, in, out, root);
        },
        -1, SIZE_MAX, in.nbytes());
  }

  work scatter(tensor_view in, tensor_view out, const scatter_options& o) override {
    bool is_root = rank() == o.root;
    if (auto c = check(out, "scatter output"); !c) return failed(c);
    if (auto c = check_root(*this, o.root, "scatter"); !c) return failed(c);
    if (is_root)
      if (auto c = check(in, "scatter input"); !c) return failed(c);
    if (auto c = check_blocks(*this, out, in, is_root, "scatter"); !c) return failed(c);
    return submit(
        "scatter", o.timeout,
        [this, in, out, root = o.root](const run_ctx& rc) -> expected<void> {
          if (out.numel == 0) return ok();
          return transport_->scatter(rc.step, in, out, root);
        },
        -1, SIZE_MAX, out.nbytes());
  }

  work reduce_scatter(tensor_view in, tensor_view out, const reduce_scatter_options& o) override {
    if (auto c = check(in, "reduce_scatter input"); !c) return failed(c);
    if (auto c = check(out, "reduce_scatter output"); !c) return failed(c);
    if (auto c = check_blocks(*this, out, in, true, "reduce_scatter"); !c) return failed(c);
    if (auto c = check_reduce(*this, in, o.op, "reduce_scatter"); !c) return failed(c);
    auto fn = *cpu_reduce(in.type, o.op);
    return submit(
        "reduce_scatter", o.timeout,
        [this, in, out, fn, op = o.op](const run_ctx& rc) -> expected<void> {
          if (out.numel == 0) return ok();
          TROUPE_TRY(transport_->reduce_scatter(rc.step, in, out, op, fn));
          if (op == reduce_op::avg) cpu_divide(out, static_cast<std::size_t>(size()));
          return ok();
        },
        -1, in.nbytes());
  }

  work all_to_all(tensor_view in, tensor_view out, const all_to_all_options& o) override {
    if (auto c = check(in, "all_to_all input"); !c) return failed(c);
    if (auto c = check(out, "all_to_all output"); !c) return failed(c);
    auto layout = check_all_to_all(*this, in, out, o);
    if (!layout) return failed(expected<void>(std::move(layout).error()));
    bool uneven = !o.send_counts.empty();
    return submit(
        "all_to_all", o.timeout,
        [this, in, out, l = *layout, uneven](const run_ctx& rc) -> expected<void> {
          if (!uneven && in.numel == 0) return ok();
          return transport_->all_to_all(rc.step, in, out, uneven ? &l : nullptr);
        },
        -1, SIZE_MAX, in.nbytes());
  }

  work barrier(const barrier_options& o) override {
    return submit(
        "barrier", o.timeout,
        [this](const run_ctx& rc) -> expected<void> {
          if (size() == 1) return ok();
          return transport_->barrier(rc.step);
        },
        -1, 0);
  }

  work send(tensor_view t, int dst, const p2p_options& o) override { return p2p(t, dst, o, true); }
  work recv(tensor_view t, int src, const p2p_options& o) override { return p2p(t, src, o, false); }

  std::optional<troupe::error> failure() const override {
    std::lock_guard lk(mu_);
    return failure_;
  }

  void abort(troupe::error why) override {
    std::deque<task> queued;
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
    }
    gloo_metrics::queue_depth().add(-static_cast<std::int64_t>(queued.size()));
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
    for (auto& t : queued) t.done.complete(stopped_by(t.what, why));
    for (auto& w : posted) w.done.complete(stopped_by(w.what, why));
  }

  void shutdown(duration timeout) override {
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
      idle = idle_cv_.wait_for(lk, timeout, [&] {
        return !busy_ && !p2p_busy_ && queue_.empty() && p2p_queue_.empty();
      });
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

 private:
  // A point-to-point body posts its transfer and hands the posted buffer here, for the
  // p2p thread to complete; the worker moves on to the next operation meanwhile.
  struct handed_off {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool is_send;
    int peer;
    std::chrono::milliseconds timeout;
  };
  struct run_ctx {
    gloo_transport::op_step step;
    // Set by a point-to-point body (null for collectives).
    std::optional<handed_off>* handoff = nullptr;
  };
  struct task {
    std::string what;
    std::uint64_t seq;
    duration timeout;
    work::completer done;
    std::function<expected<void>(const run_ctx&)> body;
    int peer = -1;  // the other rank of a point-to-point transfer
    // The worker leaves it to its waiter until then (min: start at once); see submit().
    clock::time_point start_by = clock::time_point::min();
    std::string_view op;           // "allreduce", ...: a literal, for the metrics
    std::size_t bytes = SIZE_MAX;  // the tensor's bytes; SIZE_MAX: not given
  };
  struct p2p_wait {
    std::string what;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool is_send;
    int peer;
    clock::time_point deadline;
    duration timeout;
    work::completer done;
  };

  expected<void> check(const tensor_view& t, std::string_view what) const {
    auto c = check_tensor(t, what, /*want_cuda=*/false);
    if (!c)
      return std::move(c).error().with_operation(strcat("collectives.gloo on ", describe(*this)));
    return ok();
  }

  work failed(expected<void> why) const { return work::completed(std::move(why)); }

  // The error of operation `what` ended by abort(why): why's code, naming the operation.
  static troupe::error stopped_by(const std::string& what, const troupe::error& why) {
    return troupe::error(why.code(), strcat(what, " was stopped: ", why.message()));
  }

  // Fails every member's operations at once: closes the connections under them and
  // marks the shared memory failed.
  void break_connections() {
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
  // grace; get_future(), is_completed() and a wait() that could not run it inline end the
  // grace at once (urge).
  // `metric_bytes` is the size the metrics record when `bytes` is not given.
  work submit(std::string_view op, duration timeout,
              std::function<expected<void>(const run_ctx&)> body, int peer = -1,
              std::size_t bytes = SIZE_MAX, std::size_t metric_bytes = SIZE_MAX) {
    std::unique_lock lk(mu_);
    std::uint64_t seq = peer < 0 ? ++seq_ : ++p2p_seq_;
    // Built by appending, with the group's description (which never changes) made once:
    // two string streams per operation were about a sixth of a 4 KiB allreduce at world 2
    // (5.0 -> 4.2 us, medians of 4 alternating runs of collectives_bench).
    if (description_.empty()) description_ = describe(*this);
    std::string what;
    what.reserve(op.size() + 24 + description_.size());
    what.append(op).append(peer < 0 ? " #" : " #p").append(std::to_string(seq)).append(" on ");
    what.append(description_);
    // A collective's waiter may run it itself (run_inline); transfers stay with the worker.
    auto [w, done] = peer >= 0 ? work::make(what)
                               : work::make(
                                     what,
                                     [weak = weak_from_this(), seq] {
                                       if (auto g = weak.lock()) g->run_inline(seq);
                                     },
                                     [weak = weak_from_this(), seq] {
                                       if (auto g = weak.lock()) g->urge(seq);
                                     });
    if (aborted_) {  // before shut_down: the abort says why the group ended
      auto why = *failure_;
      lk.unlock();
      done.complete(stopped_by(what, why));
      return w;
    }
    if (stopping_) {
      lk.unlock();
      done.complete(make_error(errc::shut_down, what, ": the group was shut down"));
      return w;
    }
    const auto now = clock::now();
    const bool hold = peer < 0 && bytes <= small_op_bytes;
    last_submit_ = now;
    queue_.push_back(task{std::move(what), seq, timeout, done, std::move(body), peer,
                          hold ? now + inline_grace : clock::time_point::min(), op,
                          bytes != SIZE_MAX ? bytes : metric_bytes});
    gloo_metrics::queue_depth().add(1);
    // A polling worker finds a held operation by itself; a parked one must be woken.
    const bool wake = !hold || worker_parked_;
    lk.unlock();
    if (wake) cv_.notify_one();
    return w;
  }

  // Ends the grace of collective `seq` and of every one queued before it.
  void urge(std::uint64_t seq) {
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

  work p2p(tensor_view t, int peer, const p2p_options& o, bool is_send) {
    const char* op = is_send ? "send" : "recv";
    if (auto c = check(t, op); !c) return failed(c);
    if (auto c = check_peer(*this, peer, op); !c) return failed(c);
    if (o.tag > 0xffff)
      return failed(make_error(errc::invalid_argument, op, " on ", describe(*this), ": tag ", o.tag,
                               " is above 65535"));
    // The worker only posts the transfer; the p2p thread completes the work.
    return submit(
        op, o.timeout,
        [this, t, peer, o, is_send](const run_ctx& rc) -> expected<void> {
          auto buf = tcp_->post(t, peer, o.tag, is_send);
          if (!buf) return std::move(buf).error();
          *rc.handoff = handed_off{std::move(*buf), is_send, peer, rc.step.timeout};
          return ok();
        },
        peer);
  }

  // The worker runs the queued operations in order, one at a time. An operation runs on
  // whichever thread takes it first: this worker, or a waiter in run_inline. busy_ (under
  // mu_) says one is running; the other never starts another meanwhile, so the group's
  // per-operation state (the transport and its scratch) has one user at a time.
  void run_worker() {
    for (;;) {
      task t;
      {
        std::unique_lock lk(mu_);
        for (;;) {
          if (!busy_ && !queue_.empty()) {
            const auto start_by = queue_.front().start_by;
            if (stopping_ || failure_ || start_by <= clock::now()) break;
            cv_.wait_until(lk, start_by);  // its waiter may take it meanwhile
            continue;
          }
          if (stopping_ && !busy_) return;  // the queue is empty
          // Nothing to start. While operations keep coming, poll for held ones instead
          // of asking each submit for a wake-up; after a quiet spell, park.
          if (clock::now() - last_submit_ < park_after) {
            cv_.wait_for(lk, inline_grace);
          } else {
            worker_parked_ = true;
            cv_.wait(lk);
            worker_parked_ = false;
          }
        }
        t = std::move(queue_.front());
        queue_.pop_front();
        gloo_metrics::queue_depth().add(-1);
        if (stopping_) {
          lk.unlock();
          t.done.complete(make_error(errc::shut_down, t.what, ": the group was shut down first"));
          continue;
        }
        if (failure_) {
          auto e = *failure_;
          lk.unlock();
          t.done.complete(make_error(e.code(), t.what,
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
  void run_inline(std::uint64_t seq) {
    task t;
    {
      std::lock_guard lk(mu_);
      if (busy_ || stopping_ || failure_ || queue_.empty() || queue_.front().peer >= 0 ||
          queue_.front().seq != seq)
        return;
      t = std::move(queue_.front());
      queue_.pop_front();
      gloo_metrics::queue_depth().add(-1);
      busy_ = true;
    }
    execute(t);
  }

  // Runs a task taken from the queue with busy_ set, completes its work and clears busy_.
  void execute(task& t) {
    auto budget = roll_call_budget(t.timeout);
    std::optional<handed_off> handoff;
    run_ctx rc{{static_cast<std::uint32_t>(t.seq & 0xffffffu),
                std::max(t.timeout - budget, duration(1)), t.seq},
               t.peer >= 0 ? &handoff : nullptr};
    const auto started = clock::now();
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
      p2p_queue_.push_back(p2p_wait{t.what, std::move(handoff->buffer), handoff->is_send,
                                    handoff->peer, clock::now() + handoff->timeout, t.timeout,
                                    t.done});
      p2p_cv_.notify_one();
    } else {
      if (t.peer < 0) metrics_.record(t.op, t.bytes, clock::now() - started);
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
  void fail_group(task& t, const troupe::error& cause, duration budget) {
    {
      std::unique_lock lk(mu_);
      if (aborted_) {
        // Stopped on purpose: the abort's error, without asking who arrived.
        auto why = *failure_;
        lk.unlock();
        t.done.complete(stopped_by(t.what, why));
        return;
      }
    }
    break_connections();
    auto missing =
        t.peer >= 0
            ? std::optional(std::vector<int>{spec().global_ranks[static_cast<std::size_t>(t.peer)]})
            : roll_call(*store_, spec(), t.seq, budget);
    auto e = make_error(cause.code(), t.what, " failed (timeout ", format_duration(t.timeout),
                        "): ", describe_missing(missing), "; ", cause.message());
    {
      std::lock_guard lk(mu_);
      if (!failure_) failure_ = e;
    }
    TROUPE_LOG(log_level::warn, "collectives", e.message());
    t.done.complete(e);
  }

  void run_p2p() {
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

  std::shared_ptr<store> store_;
  // The group's full mesh, and the transport chosen at connect (tcp_ itself, or one that
  // holds it); null until connected and after shutdown (under teardown_mu_ there).
  std::shared_ptr<gloo_transport::tcp> tcp_;
  std::shared_ptr<gloo_transport::transport> transport_;
  // What each member asked for at connect (index: group rank; empty in a group of one).
  std::vector<gloo_hier::member_choice> choices_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable p2p_cv_;
  std::deque<task> queue_;
  std::deque<p2p_wait> p2p_queue_;
  std::condition_variable idle_cv_;
  std::uint64_t seq_ = 0;
  std::uint64_t p2p_seq_ = 0;
  bool stopping_ = false;
  bool busy_ = false;
  std::string description_;  // describe(*this), made by the first submit (under mu_)
  // The metrics of the collectives that succeeded (only execute() records, under busy_).
  gloo_metrics::op_metrics metrics_;
  bool worker_parked_ = false;       // the worker waits for a notify, not polling
  clock::time_point last_submit_{};  // when the last operation was queued
  bool p2p_busy_ = false;
  // The transfer the p2p thread waits for (under mu_), so that abort() can end its wait.
  gloo::transport::UnboundBuffer* p2p_current_ = nullptr;
  bool p2p_current_is_send_ = false;
  std::optional<troupe::error> failure_;
  bool aborted_ = false;  // abort() ran; failure_ holds its error (under mu_)
  // Orders abort()'s closing of the transport with shutdown()'s release of it.
  std::mutex teardown_mu_;
  std::thread worker_;
  std::thread p2p_thread_;
};

expected<std::shared_ptr<process_group>> create_gloo(const group_spec& spec) {
  metrics::start_export_from_env();  // under troupe-run --metrics-port
  auto g = std::make_shared<gloo_group>(spec);
  TROUPE_TRY(g->connect());
  // One small allreduce checks that every member arrived and the mesh works.
  std::int32_t one = 1;
  allreduce_options o;
  o.timeout = spec.timeout;
  auto w = g->allreduce(tensor_view{&one, dtype::int32, 1, device::cpu()}, o);
  if (auto r = w.wait(spec.timeout + std::chrono::seconds(1)); !r)
    return std::move(r).error().with_operation("collectives.gloo.check");
  if (one != spec.size)
    return make_error(errc::internal, "the check allreduce of group '", spec.name, "' gave ", one,
                      " instead of ", spec.size);
  return std::shared_ptr<process_group>(std::move(g));
}

}  // namespace

backend_info gloo_backend_info() {
  backend_info b;
  b.name = "gloo";
  b.description = "CPU tensors over Gloo's TCP transport";
  b.viable = [] { return true; };
  b.create = create_gloo;
  return b;
}

}  // namespace troupe::collectives
