// Why this file is long (~740 lines): the NCCL group's operations, its watchdog and its
// failure path (roll call, waiters told, communicator aborted) share the pending queue,
// the communicator lock and the sticky error; the pieces that need none of them are in
// their own files (nccl_comm, stream_ordering, watchdog, nccl_errors, unique_id).
#include <troupe/collectives/nccl/nccl_group.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <troupe/collectives/nccl/nccl_comm.hpp>
#include <troupe/collectives/nccl/nccl_errors.hpp>
#include <troupe/collectives/nccl/stream_ordering.hpp>
#include <troupe/collectives/nccl/unique_id.hpp>
#include <troupe/collectives/nccl/watchdog.hpp>
#include <troupe/collectives/op_checks.hpp>
#include <troupe/collectives/roll_call.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/store/prefix_store.hpp>

namespace troupe::collectives {

int nccl_device_for(int world_rank, int device_count) {
  int base = world_rank;
  if (auto v = settings::local_rank.value()) base = std::atoi(v->c_str());
  return device_count > 0 ? base % device_count : 0;
}

namespace {

constexpr auto watchdog_interval = std::chrono::microseconds(200);

// Ends an operation with a failed work when an argument check fails.
#define TROUPE_TRY_WORK(expr)                                   \
  do {                                                          \
    if (auto troupe_check_ = (expr); !troupe_check_)            \
      return work::completed(std::move(troupe_check_).error()); \
  } while (false)

// Runs `body` (a series of NCCL calls returning the first failure) inside
// ncclGroupStart/ncclGroupEnd; the group is always closed.
template <class Body>
ncclResult_t grouped(Body body) {
  if (auto r = ncclGroupStart(); r != ncclSuccess) return r;
  ncclResult_t first = body();
  ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::float32:
      return ncclFloat32;
    case dtype::float64:
      return ncclFloat64;
    case dtype::float16:
      return ncclFloat16;
    case dtype::bfloat16:
      return ncclBfloat16;
    case dtype::int32:
      return ncclInt32;
    case dtype::int64:
      return ncclInt64;
    case dtype::uint8:
      return ncclUint8;
    case dtype::int8:
      return ncclInt8;
    // NCCL has no 16-bit integer or boolean type. supports() refuses to reduce them, so
    // only operations that move bits unchanged see these: any type of the same size
    // carries them exactly.
    case dtype::int16:
      return ncclFloat16;
    case dtype::boolean:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::avg:
      return ncclAvg;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::product:
      return ncclProd;
  }
  return ncclSum;
}

class nccl_group final : public process_group {
 public:
  nccl_group(const group_spec& spec, int device)
      : process_group(spec),
        store_(std::make_shared<prefix_store>(spec.root_store, spec.name + "/nccl")),
        device_(device),
        api_(make_cuda_stream_api()) {}

  ~nccl_group() override { shutdown(std::chrono::seconds(10)); }

  // Sets up the scratch memory and starts the watchdog around `comm`.
  expected<void> start(std::unique_ptr<nccl_comm> comm) {
    comm_ = std::move(comm);
    TROUPE_TRY(cuda(cudaSetDevice(device_), "cudaSetDevice"));
    void* p = nullptr;
    TROUPE_TRY(cuda(cudaMalloc(&p, 16), "cudaMalloc"));
    scratch_ = p;
    watchdog_ = std::thread([this] { run_watchdog(); });
    return ok();
  }

  // One small allreduce through the new communicator.
  expected<void> self_check() {
    std::int32_t one = 1;
    TROUPE_TRY(cuda(cudaMemcpy(scratch_, &one, sizeof one, cudaMemcpyHostToDevice), "cudaMemcpy"));
    allreduce_options o;
    o.timeout = spec().timeout;
    TROUPE_TRY(allreduce(tensor_view{scratch_, dtype::int32, 1, device::cuda(device_).value()}, o)
                   .wait(spec().timeout + std::chrono::seconds(1)));
    TROUPE_TRY(cuda(cudaMemcpy(&one, scratch_, sizeof one, cudaMemcpyDeviceToHost), "cudaMemcpy"));
    if (one != size())
      return make_error(errc::internal, "the check allreduce of ", describe(*this), " gave ", one);
    return ok();
  }

  std::string_view backend_name() const noexcept override { return "nccl"; }
  bool supports(dtype type, reduce_op op) const noexcept override {
    if (type == dtype::int16 || type == dtype::boolean || element_size(type) == 0) return false;
    return op != reduce_op::avg || is_floating(type);
  }

  work allreduce(tensor_view t, const allreduce_options& o) override {
    TROUPE_TRY_WORK(check(t, "allreduce"));
    TROUPE_TRY_WORK(check_reduce(*this, t, o.op, "allreduce"));
    return launch("allreduce", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclAllReduce(t.data, t.data, t.numel, nccl_type(t.type), nccl_op(o.op), comm(), s);
    });
  }

  work broadcast(tensor_view t, const broadcast_options& o) override {
    TROUPE_TRY_WORK(check(t, "broadcast"));
    TROUPE_TRY_WORK(check_root(*this, o.root, "broadcast"));
    return launch("broadcast", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclBroadcast(t.data, t.data, t.numel, nccl_type(t.type), o.root, comm(), s);
    });
  }

  work reduce(tensor_view t, const reduce_options& o) override {
    TROUPE_TRY_WORK(check(t, "reduce"));
    TROUPE_TRY_WORK(check_root(*this, o.root, "reduce"));
    TROUPE_TRY_WORK(check_reduce(*this, t, o.op, "reduce"));
    // The receive buffer is only written on the root: the others keep their input.
    return launch("reduce", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclReduce(t.data, t.data, t.numel, nccl_type(t.type), nccl_op(o.op), o.root, comm(),
                        s);
    });
  }

  work allgather(tensor_view in, tensor_view out, const allgather_options& o) override {
    TROUPE_TRY_WORK(check(in, "allgather input"));
    TROUPE_TRY_WORK(check(out, "allgather output"));
    TROUPE_TRY_WORK(check_blocks(*this, in, out, true, "allgather"));
    return launch("allgather", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclAllGather(in.data, out.data, in.numel, nccl_type(in.type), comm(), s);
    });
  }

  work gather(tensor_view in, tensor_view out, const gather_options& o) override {
    bool is_root = rank() == o.root;
    TROUPE_TRY_WORK(check(in, "gather input"));
    TROUPE_TRY_WORK(check_root(*this, o.root, "gather"));
    if (is_root) TROUPE_TRY_WORK(check(out, "gather output"));
    TROUPE_TRY_WORK(check_blocks(*this, in, out, is_root, "gather"));
    return launch("gather", o.timeout, o.stream, [&](cudaStream_t s) -> ncclResult_t {
      auto ty = nccl_type(in.type);
      if (!is_root) return ncclSend(in.data, in.numel, ty, o.root, comm(), s);
      if (cudaMemcpyAsync(out.slice(static_cast<std::size_t>(rank()) * in.numel, in.numel).data,
                          in.data, in.nbytes(), cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
      return grouped([&] {
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          auto res = ncclRecv(out.slice(static_cast<std::size_t>(r) * in.numel, in.numel).data,
                              in.numel, ty, r, comm(), s);
          if (res != ncclSuccess) return res;
        }
        return ncclSuccess;
      });
    });
  }

  work scatter(tensor_view in, tensor_view out, const scatter_options& o) override {
    bool is_root = rank() == o.root;
    TROUPE_TRY_WORK(check(out, "scatter output"));
    TROUPE_TRY_WORK(check_root(*this, o.root, "scatter"));
    if (is_root) TROUPE_TRY_WORK(check(in, "scatter input"));
    TROUPE_TRY_WORK(check_blocks(*this, out, in, is_root, "scatter"));
    return launch("scatter", o.timeout, o.stream, [&](cudaStream_t s) -> ncclResult_t {
      auto ty = nccl_type(out.type);
      if (!is_root) return ncclRecv(out.data, out.numel, ty, o.root, comm(), s);
      if (cudaMemcpyAsync(out.data,
                          in.slice(static_cast<std::size_t>(rank()) * out.numel, out.numel).data,
                          out.nbytes(), cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
      return grouped([&] {
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          auto res = ncclSend(in.slice(static_cast<std::size_t>(r) * out.numel, out.numel).data,
                              out.numel, ty, r, comm(), s);
          if (res != ncclSuccess) return res;
        }
        return ncclSuccess;
      });
    });
  }

  work reduce_scatter(tensor_view in, tensor_view out, const reduce_scatter_options& o) override {
    TROUPE_TRY_WORK(check(in, "reduce_scatter input"));
    TROUPE_TRY_WORK(check(out, "reduce_scatter output"));
    TROUPE_TRY_WORK(check_blocks(*this, out, in, true, "reduce_scatter"));
    TROUPE_TRY_WORK(check_reduce(*this, in, o.op, "reduce_scatter"));
    return launch("reduce_scatter", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data, out.data, out.numel, nccl_type(in.type), nccl_op(o.op),
                               comm(), s);
    });
  }

  work all_to_all(tensor_view in, tensor_view out, const all_to_all_options& o) override {
    TROUPE_TRY_WORK(check(in, "all_to_all input"));
    TROUPE_TRY_WORK(check(out, "all_to_all output"));
    auto l = check_all_to_all(*this, in, out, o);
    if (!l) return work::completed(std::move(l).error());
    return launch("all_to_all", o.timeout, o.stream, [&](cudaStream_t s) -> ncclResult_t {
      auto ty = nccl_type(in.type);
      return grouped([&] {
        for (int r = 0; r < size(); ++r) {
          auto ri = static_cast<std::size_t>(r);
          if (l->send_counts[ri] > 0)
            if (auto res = ncclSend(in.slice(l->send_offsets[ri], 0).data, l->send_counts[ri], ty,
                                    r, comm(), s);
                res != ncclSuccess)
              return res;
          if (l->recv_counts[ri] > 0)
            if (auto res = ncclRecv(out.slice(l->recv_offsets[ri], 0).data, l->recv_counts[ri], ty,
                                    r, comm(), s);
                res != ncclSuccess)
              return res;
        }
        return ncclSuccess;
      });
    });
  }

  work barrier(const barrier_options& o) override {
    // An allreduce of one scratch element; its completion is the barrier.
    return launch("barrier", o.timeout, o.stream, [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm(), s);
    });
  }

  work send(tensor_view t, int dst, const p2p_options& o) override {
    TROUPE_TRY_WORK(check(t, "send"));
    TROUPE_TRY_WORK(check_peer(*this, dst, "send"));
    return launch(
        "send", o.timeout, o.stream,
        [&](cudaStream_t s) {
          return ncclSend(t.data, t.numel, nccl_type(t.type), dst, comm(), s);
        },
        dst);
  }

  work recv(tensor_view t, int src, const p2p_options& o) override {
    TROUPE_TRY_WORK(check(t, "recv"));
    TROUPE_TRY_WORK(check_peer(*this, src, "recv"));
    return launch(
        "recv", o.timeout, o.stream,
        [&](cudaStream_t s) {
          return ncclRecv(t.data, t.numel, nccl_type(t.type), src, comm(), s);
        },
        src);
  }

  std::optional<troupe::error> failure() const override {
    std::lock_guard lk(mu_);
    return failure_;
  }

  void abort(troupe::error why) override {
    bool again = false;
    {
      std::lock_guard lk(mu_);
      if (!failure_) failure_ = std::move(why);
      again = aborted_;
      aborted_ = true;
      retired_ = false;
    }
    {
      // Also after retire(), which kept the communicator: nccl_comm::abort is idempotent.
      std::lock_guard lk(comm_mu_);
      if (comm_) comm_->abort();
    }
    if (again) return;
    TROUPE_LOG(log_level::info, "collectives", describe(*this), " aborted: ", failure()->message());
    fail_aborted();
    cv_.notify_all();
  }

  // Like abort() for the operations, but the communicator stays for rebuild_native():
  // pending work fails at once with `why`; nothing is aborted on the device yet (a shrink
  // with NCCL_SHRINK_ABORT, or the abort of a re-create or of shutdown(), ends it).
  void retire(troupe::error why) override {
    {
      std::lock_guard lk(mu_);
      if (aborted_) return;
      failed_before_retire_ = failure_.has_value();
      // The watchdog may hold a batch out of pending_ while it polls: count it as pending.
      pending_at_retire_ = !pending_.empty() || watchdog_holding_;
      if (!failure_) failure_ = std::move(why);
      aborted_ = true;  // fail_aborted() and the watchdog treat both alike
      retired_ = true;
    }
    TROUPE_LOG(log_level::info, "collectives", describe(*this),
               " retired, its communicator kept for the next epoch: ", failure()->message());
    fail_aborted();
    cv_.notify_all();
  }

  std::optional<comm_state> rebuild_state() const override {
    comm_state st;
    {
      std::lock_guard lk(mu_);
      st.pending_work = pending_at_retire_ || !pending_.empty();
      st.in_error = failed_before_retire_ || (failure_.has_value() && !retired_);
    }
    // A library that says 2.27 or newer but lacks the symbol counts as unknown.
    const int v = nccl_comm::library_version();
    st.library_version = nccl_comm::can_shrink() || !shrink_supported(v) ? v : 0;
    std::lock_guard lk(comm_mu_);
    st.live = comm_ && !comm_->aborted();
    if (st.live && !comm_->async_status()) st.in_error = true;
    return st;
  }

  expected<std::shared_ptr<process_group>> rebuild_native(const group_spec& next,
                                                          const comm_plan& plan) override {
    if (plan.action == comm_action::recreate) return std::shared_ptr<process_group>();
    std::unique_ptr<nccl_comm> c;
    {
      std::lock_guard lk(comm_mu_);
      if (!comm_)
        return make_error(errc::invalid_argument, describe(*this),
                          " has no communicator to shrink");
      TROUPE_TRY(cuda(cudaSetDevice(device_), "cudaSetDevice"));
      // keep: a new group still needs a communicator of its own; a split with one color
      // gives one of the same ranks.
      auto r = plan.action == comm_action::keep
                   ? comm_->split(0, rank(), next.name, next.timeout)
                   : comm_->shrink(plan.excluded, plan.abort_first, next.name, next.timeout);
      // The parent is done either way: its operations were failed when it was retired.
      comm_->abort();
      if (!r) return std::move(r).error().with_operation("collectives.nccl.shrink");
      c = std::move(*r);
    }
    auto g = std::make_shared<nccl_group>(next, device_);
    TROUPE_TRY(g->start(std::move(c)));
    TROUPE_TRY(g->self_check());
    return std::shared_ptr<process_group>(std::move(g));
  }

  void shutdown(duration timeout) override {
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    auto dl = deadline::after(timeout);
    // Let launched work finish; the watchdog keeps completing it meanwhile.
    {
      std::unique_lock lk(mu_);
      cv_.wait_until(lk, dl.time_point(), [&] { return pending_.empty(); });
    }
    bool leftover = false;
    {
      std::lock_guard lk(mu_);
      leftover = !pending_.empty();
      quit_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) {
      std::lock_guard lk(comm_mu_);
      if (leftover || failure().has_value())
        comm_->abort();
      else
        (void)comm_->finalize(std::max(dl.remaining(), duration(100)));
    }
    std::deque<pending_op> rest;
    {
      std::lock_guard lk(mu_);
      rest.swap(pending_);
    }
    for (auto& p : rest) {
      p.completer.complete(make_error(errc::shut_down, p.what,
                                      ": the group was shut down before "
                                      "it finished"));
      api_->destroy_event(p.done_event);
    }
    // After an abort, kernels may still sit in a stream behind the caller's work;
    // cudaFree would synchronize the device and wait for them. Leave the 16 bytes to the
    // process instead.
    bool failed = failure().has_value();
    if (scratch_ && !failed) (void)cudaFree(scratch_);
    scratch_ = nullptr;
  }

  expected<std::shared_ptr<process_group>> split_native(const group_spec* child,
                                                        int color) override {
    if (auto f = failure()) return *f;
    std::unique_ptr<nccl_comm> c;
    {
      std::lock_guard lk(comm_mu_);
      TROUPE_TRY(cuda(cudaSetDevice(device_), "cudaSetDevice"));
      auto r = comm_->split(child ? color : -1, child ? child->rank : 0,
                            child ? child->name : std::string(), spec().timeout);
      if (!r) return std::move(r).error().with_operation("collectives.nccl.split");
      c = std::move(*r);
    }
    if (!child || !c) return std::shared_ptr<process_group>();
    auto g = std::make_shared<nccl_group>(*child, device_);
    TROUPE_TRY(g->start(std::move(c)));
    TROUPE_TRY(g->self_check());
    return std::shared_ptr<process_group>(std::move(g));
  }

 private:
  static expected<void> cuda(cudaError_t r, std::string_view call) {
    if (r == cudaSuccess) return ok();
    return cuda_error(r, call);
  }

  ncclComm_t comm() const { return comm_->get(); }

  expected<void> check(const tensor_view& t, std::string_view what) const {
    TROUPE_TRY(check_tensor(t, what, /*want_cuda=*/true));
    if (t.where.index() != device_)
      return make_error(errc::invalid_argument, what, " on ", describe(*this), " lives on ",
                        t.where.to_string(), " but this group uses cuda:", device_);
    return ok();
  }

  // Queues one NCCL operation on the caller's stream (`call(stream)` returns the
  // ncclResult_t of its last call), in the communicator's one order (stream_sequencer), and
  // hands its end event to the watchdog.
  // Collectives are numbered in call order, the same on every member (the roll-call key);
  // point-to-point transfers (peer >= 0) have a count of their own.
  template <class F>
  work launch(std::string_view op, duration timeout, void* caller_stream, F&& call, int peer = -1) {
    std::unique_lock lk(comm_mu_);
    std::uint64_t seq = peer < 0 ? ++seq_ : ++p2p_seq_;
    // Built by appending: a string stream per operation costs more than the NCCL call.
    std::string what;
    what.reserve(op.size() + described_.size() + 28);
    what.append(op)
        .append(peer < 0 ? " #" : " #p")
        .append(std::to_string(seq))
        .append(" on ")
        .append(described_);
    // The span covers queueing the kernel on the stream (host time), not the GPU's work.
    trace::span traced("collectives", op);
    if (traced.on())
      traced.args()
          .add("group", name())
          .add(peer < 0 ? "seq" : "p2p_seq", seq)
          .add("transport", "nccl")
          .add("rank", rank())
          .add("size", size())
          .add("phase", "enqueue");
    if (auto f = failure())
      return work::completed(
          make_error(f->code(), what, " was not run: the group failed earlier: ", f->message()),
          what);
    if (stopping())
      return work::completed(make_error(errc::shut_down, what, ": the group was shut down"), what);
    auto budget = roll_call_budget(timeout);
    // Asking costs less than setting (about 0.2 us per operation on an H200).
    if (int current = -1; cudaGetDevice(&current) != cudaSuccess || current != device_)
      if (auto r = cuda(cudaSetDevice(device_), "cudaSetDevice"); !r)
        return work::completed(std::move(r).error(), what);
    auto ev = order_.launch(caller_stream, [&](void* s) -> expected<void> {
      return comm_->check(call(static_cast<cudaStream_t>(s)), op, timeout);
    });
    if (!ev) {
      lk.unlock();
      auto e = fail_group(ev.error().code(), strcat(what, " could not be queued: "), {}, seq, peer,
                          budget, ev.error().message());
      return work::completed(std::move(e), what);
    }
    const std::uint64_t ticket = ++launched_;
    auto [w, done] = work::make(what, hurry_, ticket);
    pending_op p;
    p.ticket = ticket;
    p.seq = seq;
    p.peer = peer;
    p.what = std::move(what);  // the work holds its own copy
    p.timeout = timeout;
    p.deadline = clock::now() + std::max(timeout - budget, duration(1));
    p.done_event = *ev;
    p.completer = done;
    lk.unlock();
    bool was_empty = false;
    {
      std::lock_guard g(mu_);
      was_empty = pending_.empty();
      pending_.push_back(std::move(p));
    }
    // The watchdog sleeps on the condition only while nothing is pending; otherwise it
    // polls every watchdog_interval anyway, and a wake-up per operation costs a syscall.
    if (was_empty) cv_.notify_all();
    return w;
  }

  bool stopping() const {
    std::lock_guard lk(mu_);
    return stopping_;
  }

  // After abort(): fails what is pending with the abort's error (no roll call; the
  // communicator is gone). Called by abort() and by the watchdog, which may have held a
  // batch out of pending_ while abort() ran.
  void fail_aborted() {
    std::deque<pending_op> rest;
    troupe::error why;
    {
      std::lock_guard lk(mu_);
      if (!aborted_) return;
      why = *failure_;
      rest.swap(pending_);
    }
    for (auto& p : rest) {
      api_->destroy_event(p.done_event);
      p.completer.complete(
          troupe::error(why.code(), strcat(p.what, " was stopped: ", why.message())));
    }
  }

  void run_watchdog() {
    for (;;) {
      std::deque<pending_op> batch;
      {
        std::unique_lock lk(mu_);
        if (pending_.empty()) {
          cv_.wait(lk, [&] { return quit_ || !pending_.empty(); });
        }
        if (quit_) return;
        batch.swap(pending_);
        watchdog_holding_ = !batch.empty();
      }
      expected<void> async;
      {
        std::lock_guard lk(comm_mu_);
        async = comm_->async_status();
      }
      auto verdict = watchdog_poll(
          batch, clock::now(), [&](void* e) { return api_->query(e); }, async);
      {
        std::lock_guard lk(mu_);
        // Unfinished operations go back in front of the ones launched meanwhile.
        for (auto it = batch.rbegin(); it != batch.rend(); ++it)
          pending_.push_front(std::move(*it));
        watchdog_holding_ = false;
      }
      for (auto& p : verdict.finished) {
        api_->destroy_event(p.done_event);
        p.completer.complete(ok());
      }
      bool aborted = false;
      {
        std::lock_guard lk(mu_);
        aborted = aborted_;
      }
      if (aborted) {
        fail_aborted();
      } else if (verdict.cause) {
        auto seq = verdict.failed.empty() ? seq_.load() : verdict.failed.front().seq;
        auto timeout = verdict.failed.empty() ? spec().timeout : verdict.failed.front().timeout;
        std::string what =
            verdict.failed.empty() ? strcat(describe(*this)) : verdict.failed.front().what;
        int peer = verdict.failed.empty() ? -1 : verdict.failed.front().peer;
        (void)fail_group(verdict.cause->code(),
                         strcat(what, " failed (timeout ", format_duration(timeout), "): "),
                         std::move(verdict.failed), seq, peer, roll_call_budget(timeout),
                         verdict.cause->message());
      }
      cv_.notify_all();  // shutdown() waits for pending_ to drain
      std::unique_lock lk(mu_);
      if (hurried()) {
        // A waiter is blocked: poll again at once (yielding the core in between).
        lk.unlock();
        std::this_thread::yield();
        continue;
      }
      cv_.wait_for(lk, watchdog_interval, [&] { return quit_ || hurried(); });
      if (quit_) return;
    }
  }

  // Names the missing ranks, fails `failed` and everything still pending with the sticky
  // error, then aborts the communicator. The waiters hear of the failure first: NCCL's
  // abort can block until the streams its kernels wait on move again (a caller's stream
  // held by other work), and a timeout must not wait for that. Nothing new is queued
  // meanwhile (the sticky failure refuses it).
  troupe::error fail_group(errc code, const std::string& head, std::vector<pending_op> failed,
                           std::uint64_t seq, int peer, duration budget, const std::string& cause) {
    auto missing =
        peer >= 0
            ? std::optional(std::vector<int>{spec().global_ranks[static_cast<std::size_t>(peer)]})
            : roll_call(*store_, spec(), seq, budget);
    auto e = troupe::error(code, strcat(head, describe_missing(missing), "; ", cause));
    {
      std::lock_guard lk(mu_);
      if (!failure_) failure_ = e;
      for (auto& p : pending_) failed.push_back(std::move(p));
      pending_.clear();
    }
    TROUPE_LOG(log_level::warn, "collectives", e.message());
    for (auto& p : failed) p.completer.complete(e);
    {
      std::lock_guard lk(comm_mu_);
      comm_->abort();
    }
    for (auto& p : failed) api_->destroy_event(p.done_event);
    return e;
  }

  std::shared_ptr<store> store_;
  int device_;
  std::unique_ptr<stream_api> api_;
  stream_sequencer order_{*api_};  // guarded by comm_mu_
  std::unique_ptr<nccl_comm> comm_;
  void* scratch_ = nullptr;

  mutable std::mutex comm_mu_;  // serializes NCCL calls on comm_ (launch, split, abort, polling)
  std::atomic<std::uint64_t> seq_{0};
  std::uint64_t p2p_seq_ = 0;   // guarded by comm_mu_
  std::uint64_t launched_ = 0;  // guarded by comm_mu_: tickets, in launch order, of both kinds
  const std::string described_ = describe(*this);  // for the operations' descriptions
  // The watchdog's lock and wake-up, shared with the works' wait helpers (which may
  // outlive the group): a waiter raises `hurry_through` to its operation's ticket and
  // rings, and the watchdog polls without sleeping until every operation up to that one
  // has finished, so that wait() returns microseconds after the GPU finished instead of up
  // to a watchdog_interval later. Operations launched after it, which nobody waits for
  // yet, are polled every watchdog_interval: polling them without pause would have the
  // watchdog's event queries contend with the launches for the CUDA driver.
  struct wake_state {
    std::mutex mu;
    std::condition_variable cv;
    std::uint64_t hurry_through = 0;  // under mu: the latest ticket a waiter waits for
  };
  // Under mu_: whether the oldest pending operation is one a waiter waits for (or older).
  bool hurried() const {
    return !pending_.empty() && pending_.front().ticket <= wake_->hurry_through;
  }
  std::shared_ptr<wake_state> wake_ = std::make_shared<wake_state>();
  // Every work's help, called with its ticket: one hooks object for the group instead of
  // three allocations per operation (a work's own function, wrapped).
  std::shared_ptr<const work::hooks> hurry_ = std::make_shared<const work::hooks>(
      work::hooks{[wake = std::weak_ptr<wake_state>(wake_)](std::uint64_t ticket) {
                    if (auto ws = wake.lock()) {
                      {
                        std::lock_guard g(ws->mu);
                        ws->hurry_through = std::max(ws->hurry_through, ticket);
                      }
                      ws->cv.notify_all();
                    }
                  },
                  {},
                  {}});
  std::mutex& mu_ = wake_->mu;
  std::condition_variable& cv_ = wake_->cv;
  std::deque<pending_op> pending_;
  bool stopping_ = false;
  bool quit_ = false;
  std::optional<troupe::error> failure_;
  bool aborted_ = false;            // abort() or retire() ran; failure_ holds its error (under mu_)
  bool retired_ = false;            // retire() ran: the communicator is kept for rebuild_native()
  bool pending_at_retire_ = false;  // work was pending when retire() ran (under mu_)
  bool failed_before_retire_ = false;  // the group had failed before retire() (under mu_)
  bool watchdog_holding_ = false;      // the watchdog holds a batch out of pending_ (under mu_)
  std::thread watchdog_;
};

expected<std::shared_ptr<process_group>> create_nccl(const group_spec& spec) {
  auto count = cuda_device_count();
  if (!count) return std::move(count).error();
  if (*count < 1)
    return make_error(errc::unavailable, "the nccl backend needs a CUDA device; none is present");
  int world_rank = spec.global_ranks[static_cast<std::size_t>(spec.rank)];
  int dev = nccl_device_for(world_rank, *count);
  if (auto r = cudaSetDevice(dev); r != cudaSuccess) return cuda_error(r, "cudaSetDevice");
  auto st = std::make_shared<prefix_store>(spec.root_store, spec.name + "/nccl");
  auto id = exchange_unique_id(*st, "unique_id", spec.rank, spec.timeout, sizeof(ncclUniqueId),
                               []() -> expected<bytes> {
                                 ncclUniqueId u;
                                 if (auto r = ncclGetUniqueId(&u); r != ncclSuccess)
                                   return nccl_error(r, "ncclGetUniqueId");
                                 bytes b(sizeof u);
                                 std::memcpy(b.data(), &u, sizeof u);
                                 return b;
                               });
  if (!id) return std::move(id).error().with_operation("collectives.nccl.create");
  ncclUniqueId u;
  std::memcpy(&u, id->data(), sizeof u);
  auto comm = nccl_comm::init(spec.size, u, spec.rank, spec.name, spec.timeout);
  if (!comm) return std::move(comm).error().with_operation("collectives.nccl.create");
  auto g = std::make_shared<nccl_group>(spec, dev);
  TROUPE_TRY(g->start(std::move(*comm)));
  TROUPE_TRY(g->self_check());
  return std::shared_ptr<process_group>(std::move(g));
}

}  // namespace

backend_info nccl_backend_info() {
  backend_info b;
  b.name = "nccl";
  b.description = "CUDA tensors through NCCL, one communicator per group";
  b.viable = [] {
    auto n = cuda_device_count();
    return n && *n > 0;
  };
  b.create = create_nccl;
  return b;
}

}  // namespace troupe::collectives
