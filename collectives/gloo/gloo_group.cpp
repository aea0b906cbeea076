// Why this file is long (~1000 lines): it holds the group's connect sequence, its two
// threads, the inline path for small waited-for operations, the failure path (roll call,
// connections broken, waiters told) and the dispatch of every collective to Gloo, the
// direct algorithms or shared memory, which all share the task queue and the sticky
// error. What needs none of that state is in its own file: the algorithms (direct,
// hierarchical, shared_memory), the connections (full_mesh, local_sockets) and what the
// group asks of the OS (os_tuning). A transport interface chosen once per group is the
// next split (docs/architecture.md).
// The gloo process group. Threading: one worker thread per group runs the collectives in
// call order with Gloo's algorithms; a second thread waits for point-to-point transfers,
// which the worker only posts, so that a send and a recv posted back to back cannot
// deadlock. Gloo's exceptions are caught on these threads and become the group's sticky
// error; they never reach the caller.
#include <troupe/collectives/gloo/gloo_group.hpp>

#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/direct.hpp>
#include <troupe/collectives/gloo/full_mesh.hpp>
#include <troupe/collectives/gloo/hierarchical.hpp>
#include <troupe/collectives/gloo/local_sockets.hpp>
#include <troupe/collectives/gloo/os_tuning.hpp>
#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/store_adapter.hpp>
#include <troupe/collectives/interruptible_store.hpp>
#include <troupe/collectives/op_checks.hpp>
#include <troupe/collectives/roll_call.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/codec.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/metrics.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::collectives {

namespace {

// Gloo's buffer setters only use sizeof(T): pick an unsigned type of the element size.
template <class F>
void by_size(dtype t, F&& f) {
  switch (element_size(t)) {
    case 1:
      f(std::uint8_t{});
      break;
    case 2:
      f(std::uint16_t{});
      break;
    case 4:
      f(std::uint32_t{});
      break;
    default:
      f(std::uint64_t{});
      break;
  }
}

template <class T>
T* ptr(const tensor_view& t) {
  return static_cast<T*>(t.data);
}

// Point-to-point slots live above every slot Gloo's collectives use (prefix < 0x80).
constexpr std::uint64_t p2p_slot_base = std::uint64_t{0xe0} << 56;

// Collectives up to this size are held back from the worker for inline_grace, for their
// waiter to run (see submit()). Larger ones take long enough that a wake-up is noise.
constexpr std::size_t small_op_bytes = 64 << 10;
// How long a small collective is left to its waiter, and how often a worker that has had
// operations in the last park_after looks for held ones.
constexpr auto inline_grace = std::chrono::microseconds(500);
constexpr auto park_after = std::chrono::milliseconds(20);

// Fails every operation waiting on the TCP pairs of `ctx` at once with `why`, as a peer's
// closed connection would. Closing the pairs (closeConnections) does not: a receive posted
// before the close keeps waiting for its timeout. Gloo fails them through a pair's
// signalExceptionExternal (which its own timeouts call); gloo_mesh::fail_pair reaches it.
void fail_pairs(gloo::Context& ctx, const std::string& why) {
  for (int r = 0; r < ctx.size; ++r)
    if (r != ctx.rank) gloo_mesh::fail_pair(ctx.getPair(r).get(), why);
}

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
    auto host = choose_address(*setup);
    if (!host) return std::move(host).error().with_operation("collectives.gloo.connect");
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = *host;
      auto before = gloo_os::thread_ids();
      device_ = gloo::transport::tcp::CreateDevice(attr);
      gloo_os::batch_loop_threads(before, gloo_os::thread_ids());
      auto ctx = std::make_shared<gloo_mesh::context>(rank(), size());
      ctx->setTimeout(spec().timeout);
      auto connect_store = std::make_shared<prefix_store>(setup, "connect");
      gloo_store_adapter adapter(connect_store, spec().timeout);
      ctx->connect(adapter, device_, spec().interrupt);
      gloo_os::size_local_send_buffers(*ctx);
      context_ = std::move(ctx);
    } catch (...) {
      auto e = current_error();
      return make_error(e.code(), "connecting the members of ", describe(*this), " within ",
                        format_duration(spec().timeout), " failed: ", e.message())
          .with_operation("collectives.gloo.connect");
    }
    // A group across hosts reduces within each host over shared memory first.
    if (auto h = open_hierarchical(setup); !h) return std::move(h).error();
    if (!hier_) {
      if (auto s = open_shared_memory(setup); !s) return std::move(s).error();
    }
    worker_ = std::thread([this] { run_worker(); });
    p2p_thread_ = std::thread([this] { run_p2p(); });
    return ok();
  }

  // Members on one host share memory for allreduce, broadcast, allgather and barrier.
  expected<void> open_shared_memory(const std::shared_ptr<store>& setup) {
    gloo_shm::open_options so;
    so.rank = rank();
    so.size = size();
    so.world_ranks = spec().global_ranks;
    so.group = describe(*this);
    so.timeout = spec().timeout;
    gloo_shm::apply_env(so);
    auto shm_store = std::make_shared<prefix_store>(setup, "shm");
    auto shm = gloo_shm::segment::open(*shm_store, so);
    if (!shm)
      return make_error(shm.error().code(), "setting up shared memory between the members of ",
                        describe(*this), " failed: ", shm.error().message())
          .with_operation("collectives.gloo.connect");
    shm_ = std::move(*shm);
    return ok();
  }

  // The hierarchical path (collectives/gloo/hierarchical.hpp) when the members span hosts,
  // some host has two or more of them, and none turned it off; hier_ stays null otherwise.
  expected<void> open_hierarchical(const std::shared_ptr<store>& setup) {
    if (choices_.empty()) return ok();  // a group of one
    std::vector<std::string> keys;
    bool enabled = true;
    for (const auto& c : choices_) {
      keys.push_back(c.key);
      enabled = enabled && c.enabled;
    }
    auto layout = gloo_hier::host_layout::from_keys(keys, rank());
    if (!enabled || !layout.worthwhile()) return ok();
    gloo_hier::open_options ho;
    ho.rank = rank();
    ho.world_ranks = spec().global_ranks;
    ho.group = describe(*this);
    ho.min_bytes = choices_.front().min_bytes;
    ho.timeout = spec().timeout;
    auto path =
        gloo_hier::path::open(std::make_shared<prefix_store>(setup, "hier"), std::move(layout), ho);
    if (!path)
      return make_error(path.error().code(), "setting up shared memory within the hosts of ",
                        describe(*this), " failed: ", path.error().message())
          .with_operation("collectives.gloo.connect");
    hier_ = std::move(*path);
    return ok();
  }

  // The address this member's device binds and the others connect to: TROUPE_GLOO_HOST
  // when set, else this process's address for its job (core/net_address.hpp). Every
  // member publishes it with its host; a loopback address in a group across hosts is
  // refused here, naming the member and what to set, before any connection is tried.
  expected<std::string> choose_address(store& setup) {
    std::string host;
    if (auto h = settings::gloo_host.value()) {
      host = *h;
    } else if (auto here = local_address()) {
      host = *here;
    } else {
      return make_error(here.error().code(), "connecting the members of ", describe(*this),
                        ": cannot choose this member's address: ", here.error().message(),
                        " (TROUPE_GLOO_HOST sets gloo's alone)");
    }
    if (size() == 1) return host;
    bytes mine;
    byte_writer w(mine);
    const auto real_key = host_key();
    const auto choice = gloo_hier::choice_from_env(real_key);
    w.str(real_key);
    w.str(host_name());
    w.str(host);
    w.str(choice.key);
    w.u8(choice.enabled ? 1 : 0);
    w.u64(choice.min_bytes);
    auto all = all_gather(setup, "hosts", rank(), size(), mine, spec().timeout);
    if (!all)
      return make_error(all.error().code(), "connecting the members of ", describe(*this),
                        ": exchanging addresses: ", all.error().message());
    std::vector<advertised_address> members;
    for (int r = 0; r < size(); ++r) {
      byte_reader rd((*all)[static_cast<std::size_t>(r)]);
      auto key = rd.str("host key");
      auto name = rd.str("host name");
      auto address = rd.str("address");
      auto claimed = rd.str("claimed host key");
      auto enabled = rd.u8("hierarchical");
      auto min_bytes = rd.u64("hierarchical threshold");
      if (!key || !name || !address || !claimed || !enabled || !min_bytes)
        return make_error(errc::protocol_error, describe(*this), ": rank ", r,
                          " published a malformed address record");
      members.push_back({strcat("rank ", r), *key, *name, *address});
      choices_.push_back({*claimed, *enabled != 0, *min_bytes});
    }
    auto reachable = check_reachable(members, describe(*this));
    if (!reachable) return std::move(reachable).error();
    return host;
  }

  std::string_view backend_name() const noexcept override { return "gloo"; }
  bool supports(dtype type, reduce_op op) const noexcept override { return cpu_supports(type, op); }

  work allreduce(tensor_view t, const allreduce_options& o) override {
    if (auto c = check(t, "allreduce"); !c) return failed(c);
    if (auto c = check_reduce(*this, t, o.op, "allreduce"); !c) return failed(c);
    auto fn = *cpu_reduce(t.type, o.op);
    return submit(
        "allreduce", o.timeout,
        [this, t, fn, op = o.op](const run_ctx& rc) {
          if (t.numel == 0) return;
          run_allreduce(rc, t, op, fn);
          if (op == reduce_op::avg) cpu_divide(t, static_cast<std::size_t>(size()));
        },
        -1, t.nbytes());
  }

  work broadcast(tensor_view t, const broadcast_options& o) override {
    if (auto c = check(t, "broadcast"); !c) return failed(c);
    if (auto c = check_root(*this, o.root, "broadcast"); !c) return failed(c);
    return submit(
        "broadcast", o.timeout,
        [this, t, root = o.root](const run_ctx& rc) {
          if (t.numel == 0 || size() == 1) return;
          if (shm_) return shm_->broadcast(rc.seq, t, root, clock::now() + rc.timeout);
          gloo::BroadcastOptions g(context_);
          by_size(t.type, [&](auto e) { g.setOutput(ptr<decltype(e)>(t), t.numel); });
          g.setRoot(root);
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::broadcast(g);
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
        [this, t, fn, o](const run_ctx& rc) {
          if (t.numel == 0) return;
          // Gloo uses the output as scratch on every rank: keep non-roots' tensors intact.
          std::vector<std::byte> scratch;
          tensor_view target = t;
          if (rank() != o.root) {
            scratch.assign(static_cast<std::byte*>(t.data),
                           static_cast<std::byte*>(t.data) + t.nbytes());
            target.data = scratch.data();
          }
          gloo::ReduceOptions g(context_);
          by_size(t.type, [&](auto e) { g.setOutput(ptr<decltype(e)>(target), t.numel); });
          g.setRoot(o.root);
          g.setReduceFunction(fn);
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::reduce(g);
          if (o.op == reduce_op::avg && rank() == o.root)
            cpu_divide(t, static_cast<std::size_t>(size()));
        },
        -1, SIZE_MAX, t.nbytes());
  }

  work allgather(tensor_view in, tensor_view out, const allgather_options& o) override {
    if (auto c = check(in, "allgather input"); !c) return failed(c);
    if (auto c = check(out, "allgather output"); !c) return failed(c);
    if (auto c = check_blocks(*this, in, out, true, "allgather"); !c) return failed(c);
    return submit(
        "allgather", o.timeout,
        [this, in, out](const run_ctx& rc) {
          if (in.numel == 0) return;
          if (shm_) return shm_->allgather(rc.seq, in, out, clock::now() + rc.timeout);
          gloo_direct::allgather(direct_op(rc), in, out);
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
        [this, in, out, is_root, root = o.root](const run_ctx& rc) {
          if (in.numel == 0) return;
          gloo::GatherOptions g(context_);
          by_size(in.type, [&](auto e) {
            g.setInput(ptr<decltype(e)>(in), in.numel);
            if (is_root) g.setOutput(ptr<decltype(e)>(out), out.numel);
          });
          g.setRoot(root);
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::gather(g);
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
        [this, in, out, is_root, root = o.root](const run_ctx& rc) {
          if (out.numel == 0) return;
          gloo::ScatterOptions g(context_);
          by_size(out.type, [&](auto e) {
            using T = decltype(e);
            if (is_root) {
              std::vector<T*> blocks;
              for (int r = 0; r < size(); ++r)
                blocks.push_back(
                    ptr<T>(in.slice(static_cast<std::size_t>(r) * out.numel, out.numel)));
              g.setInputs(blocks, out.numel);
            }
            g.setOutput(ptr<T>(out), out.numel);
          });
          g.setRoot(root);
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::scatter(g);
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
        [this, in, out, fn, op = o.op](const run_ctx& rc) {
          if (out.numel == 0) return;
          if (shm_ && size() > 1 && !overlaps(in, out)) {
            shm_->reduce_scatter(rc.seq, in, out, op, fn, clock::now() + rc.timeout);
            if (op == reduce_op::avg) cpu_divide(out, static_cast<std::size_t>(size()));
            return;
          }
          // Gloo has no reduce-scatter taking a reduce function: allreduce a copy, keep a block.
          std::vector<std::byte> scratch(static_cast<std::byte*>(in.data),
                                         static_cast<std::byte*>(in.data) + in.nbytes());
          tensor_view all = in;
          all.data = scratch.data();
          run_allreduce(rc, all, op, fn);
          auto mine = all.slice(static_cast<std::size_t>(rank()) * out.numel, out.numel);
          std::memcpy(out.data, mine.data, out.nbytes());
          if (op == reduce_op::avg) cpu_divide(out, static_cast<std::size_t>(size()));
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
        [this, in, out, l = *layout, uneven](const run_ctx& rc) {
          if (!uneven) {
            if (in.numel == 0) return;
            gloo::AlltoallOptions g(context_);
            by_size(in.type, [&](auto e) {
              g.setInput(ptr<decltype(e)>(in), in.numel);
              g.setOutput(ptr<decltype(e)>(out), out.numel);
            });
            g.setTag(rc.tag);
            g.setTimeout(rc.timeout);
            gloo::alltoall(g);
            return;
          }
          std::vector<std::int64_t> sc(l.send_counts.begin(), l.send_counts.end());
          std::vector<std::int64_t> rcnt(l.recv_counts.begin(), l.recv_counts.end());
          // Gloo wants real buffers even for empty sides.
          std::uint64_t dummy_in = 0, dummy_out = 0;
          tensor_view i2 = in, o2 = out;
          if (in.numel == 0) i2.data = &dummy_in;
          if (out.numel == 0) o2.data = &dummy_out;
          gloo::AlltoallvOptions g(context_);
          by_size(in.type, [&](auto e) {
            g.setInput(ptr<decltype(e)>(i2), sc);
            g.setOutput(ptr<decltype(e)>(o2), rcnt);
          });
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::alltoallv(g);
        },
        -1, SIZE_MAX, in.nbytes());
  }

  work barrier(const barrier_options& o) override {
    return submit(
        "barrier", o.timeout,
        [this](const run_ctx& rc) {
          if (size() == 1) return;
          if (shm_) return shm_->barrier(rc.seq, clock::now() + rc.timeout);
          gloo::BarrierOptions g(context_);
          g.setTag(rc.tag);
          g.setTimeout(rc.timeout);
          gloo::barrier(g);
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
    queue_depth().add(-static_cast<std::int64_t>(queued.size()));
    TROUPE_LOG(log_level::info, "collectives", describe(*this), " aborted: ", why.message());
    // The running operation, on the worker or on a waiter, fails as its transport closes.
    {
      std::lock_guard lk(teardown_mu_);
      if (shm_) shm_->abort();
      if (hier_) hier_->abort();
      if (context_) fail_pairs(*context_, "the group was aborted: " + why.message());
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
      if (shm_) shm_->abort();
      if (hier_) hier_->abort();
      break_connections();
    }
    if (worker_.joinable()) worker_.join();
    if (p2p_thread_.joinable()) p2p_thread_.join();
    std::lock_guard lk(teardown_mu_);
    shm_.reset();
    hier_.reset();
    context_.reset();
    device_.reset();
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
    std::uint32_t tag;
    std::chrono::milliseconds timeout;
    std::uint64_t seq;
    // Set by a point-to-point body (null for collectives).
    std::optional<handed_off>* handoff = nullptr;
  };
  struct task {
    std::string what;
    std::uint64_t seq;
    duration timeout;
    work::completer done;
    std::function<void(const run_ctx&)> body;
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

  static troupe::error current_error() {
    try {
      throw;
    } catch (const troupe::exception& e) {
      return e.err();
    } catch (const gloo::IoException& e) {
      return gloo_direct::error_of(e);
    } catch (const std::exception& e) {
      return troupe::error(errc::internal, std::string("gloo: ") + e.what());
    } catch (...) {
      return troupe::error(errc::internal, "gloo raised a non-standard exception");
    }
  }

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

  static bool overlaps(const tensor_view& a, const tensor_view& b) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
    const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  }

  gloo_direct::op_ctx direct_op(const run_ctx& rc) const {
    return {*context_, gloo_direct::slot_of(rc.tag), clock::now() + rc.timeout};
  }

  // Allreduce in place (avg combines as sum): hierarchically when the members span hosts
  // and the tensor is large enough, through shared memory when the members share it, else
  // over TCP. On the thread running the group's operation (busy_).
  void run_allreduce(const run_ctx& rc, tensor_view t, reduce_op op, const cpu_reduce_fn& fn) {
    if (size() == 1) return;
    if (hier_ && hier_->wants(t.nbytes()))
      hier_->allreduce(*context_, gloo_direct::slot_of(rc.tag), t, op, fn,
                       clock::now() + rc.timeout);
    else if (shm_)
      shm_->allreduce(rc.seq, t, op, fn, clock::now() + rc.timeout);
    else
      gloo_direct::allreduce(direct_op(rc), t, fn, scratch_);
  }

  // Fails every member's operations at once: closes the connections under them and
  // marks the shared memory failed.
  void break_connections() {
    if (shm_) shm_->mark_failed();
    if (hier_) hier_->mark_failed();
    if (context_) {
      try {
        context_->closeConnections();
      } catch (...) {
      }
    }
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
  work submit(std::string_view op, duration timeout, std::function<void(const run_ctx&)> body,
              int peer = -1, std::size_t bytes = SIZE_MAX, std::size_t metric_bytes = SIZE_MAX) {
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
    queue_depth().add(1);
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
        [this, t, peer, o, is_send](const run_ctx& rc) {
          auto buf = context_->createUnboundBuffer(t.data, t.nbytes());
          std::uint64_t slot = p2p_slot_base | o.tag;
          if (is_send)
            buf->send(peer, slot);
          else
            buf->recv(peer, slot);
          *rc.handoff = handed_off{std::move(buf), is_send, peer, rc.timeout};
        },
        peer);
  }

  // The worker runs the queued operations in order, one at a time. An operation runs on
  // whichever thread takes it first: this worker, or a waiter in run_inline. busy_ (under
  // mu_) says one is running; the other never starts another meanwhile, so the group's
  // per-operation state (scratch_, shm_, the Gloo context) has one user at a time.
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
        queue_depth().add(-1);
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
      queue_depth().add(-1);
      busy_ = true;
    }
    execute(t);
  }

  // How task `t` moves its data, for its trace span: only the operations that reduce
  // through run_allreduce (allreduce, and reduce_scatter without shared memory) with enough
  // bytes take the hierarchical path; the group's other operations then go over TCP.
  std::string_view transport_of(const task& t) const {
    if (shm_) return "shared memory";
    const bool reduces = t.op == "allreduce" || t.op == "reduce_scatter";
    if (hier_ && t.peer < 0 && reduces && hier_->wants(t.bytes)) return "hierarchical";
    return "tcp";
  }

  // Runs a task taken from the queue with busy_ set, completes its work and clears busy_.
  void execute(task& t) {
    auto budget = roll_call_budget(t.timeout);
    std::optional<handed_off> handoff;
    run_ctx rc{static_cast<std::uint32_t>(t.seq & 0xffffffu),
               std::max(t.timeout - budget, duration(1)), t.seq, t.peer >= 0 ? &handoff : nullptr};
    const auto started = clock::now();
    trace::span traced("collectives", t.op);
    if (traced.on()) {
      traced.args()
          .add("group", spec().name)
          .add(t.peer >= 0 ? "p2p_seq" : "seq", t.seq)
          .add("transport", transport_of(t))
          .add("rank", rank())
          .add("size", size());
      if (t.bytes != SIZE_MAX) traced.args().add("bytes", static_cast<std::uint64_t>(t.bytes));
      if (t.peer >= 0)
        traced.args().add("peer", spec().global_ranks[static_cast<std::size_t>(t.peer)]);
    }
    try {
      t.body(rc);
      if (handoff) {
        std::lock_guard lk(mu_);
        p2p_queue_.push_back(p2p_wait{t.what, std::move(handoff->buffer), handoff->is_send,
                                      handoff->peer, clock::now() + handoff->timeout, t.timeout,
                                      t.done});
        p2p_cv_.notify_one();
      } else {
        if (t.peer < 0) record_collective(t, clock::now() - started);
        t.done.complete(ok());
      }
    } catch (...) {
      auto cause = current_error();
      fail_group(t, cause, budget);
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

  static metrics::gauge& queue_depth() {
    static metrics::gauge& g = metrics::get_gauge(
        "troupe_collective_queue_depth", "collectives queued on gloo groups, not yet started");
    return g;
  }

  // The time and bytes of a collective that succeeded, per operation and size class. The
  // metrics of each (operation, size class) pair are looked up once per group and kept;
  // only execute() calls this, one collective at a time (busy_), so the cache needs no lock.
  void record_collective(const task& t, std::chrono::nanoseconds took) {
    const std::string_view size = t.bytes == SIZE_MAX ? "unknown" : metrics::size_class(t.bytes);
    auto [it, fresh] = collective_metrics_.try_emplace({t.op, size});
    collective_metrics& m = it->second;
    if (fresh) {
      const metrics::labels op_size{{"op", std::string(t.op)}, {"size", std::string(size)}};
      const metrics::labels op_only{{"op", std::string(t.op)}};
      m.seconds =
          &metrics::get_histogram("troupe_collective_seconds",
                                  "time a gloo collective took on this worker, by operation "
                                  "and size class",
                                  metrics::latency_buckets(), op_size);
      m.bytes = &metrics::get_counter("troupe_collective_bytes_total",
                                      "tensor bytes of this worker's gloo collectives", op_only);
      m.calls = &metrics::get_counter("troupe_collective_calls_total",
                                      "gloo collectives this worker completed", op_only);
    }
    m.seconds->observe(took);
    m.calls->add();
    if (t.bytes != SIZE_MAX) m.bytes->add(t.bytes);
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
      try {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - clock::now());
        left = std::max(left, std::chrono::milliseconds(1));
        bool done = w.is_send ? w.buffer->waitSend(left) : w.buffer->waitRecv(left);
        if (!done) throw gloo::IoException("the transfer was aborted");
        w.done.complete(ok());
      } catch (...) {
        auto cause = current_error();
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
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo_shm::segment> shm_;  // null: the members do not share memory
  // Shared memory within each host when the members span hosts (null: not used).
  std::unique_ptr<gloo_hier::path> hier_;
  // What each member asked for at connect (index: group rank; empty in a group of one).
  std::vector<gloo_hier::member_choice> choices_;
  gloo_direct::scratch scratch_;  // the thread running the group's operation (busy_) only

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
  // The registry's metrics of each (operation, size class), for record_collective.
  struct collective_metrics {
    metrics::histogram* seconds = nullptr;
    metrics::counter* bytes = nullptr;
    metrics::counter* calls = nullptr;
  };
  std::map<std::pair<std::string_view, std::string_view>, collective_metrics> collective_metrics_;
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
