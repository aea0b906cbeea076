// The gloo process group: connecting its members, choosing once how it runs its
// collectives (transport.hpp: hierarchical across hosts, shared memory on one host, else
// TCP), and each operation's argument checks and body, submitted to the group's runner
// (group_runner.hpp: the queue, the threads, the sticky error and the failure path).
#include <troupe/collectives/gloo/gloo_group.hpp>

#include <gloo/transport/unbound_buffer.h>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/group_runner.hpp>
#include <troupe/collectives/gloo/hier_transport.hpp>
#include <troupe/collectives/gloo/member_addresses.hpp>
#include <troupe/collectives/gloo/os_tuning.hpp>
#include <troupe/collectives/gloo/shm_transport.hpp>
#include <troupe/collectives/gloo/tcp_transport.hpp>
#include <troupe/collectives/interruptible_store.hpp>
#include <troupe/collectives/op_checks.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/metrics.hpp>
#include <troupe/store/prefix_store.hpp>

namespace troupe::collectives {

namespace {

class gloo_group final : public gloo_runner::group_runner {
 public:
  explicit gloo_group(const group_spec& spec) : group_runner(spec) {}

  // Stops the threads before this part of the group goes: the bodies they run use it.
  ~gloo_group() override { shutdown(std::chrono::seconds(30)); }

  expected<void> connect() {
    gloo_os::ignore_sigpipe_once();
    // The setup's store waits end when the spec's interrupt says so (as does the mesh's
    // pair connect, through gloo_mesh); later ones (roll calls) are bounded by timeouts.
    std::shared_ptr<store> setup = group_store();
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
    auto chosen = choose_transport(setup, *tcp, *host);
    if (!chosen) return std::move(chosen).error();
    TROUPE_LOG(log_level::debug, "collectives", describe(*this), " runs its collectives over ",
               (*chosen)->name());
    start(std::move(*tcp), std::move(*chosen));
    return ok();
  }

  // The group's transport, once: the hierarchical one when the members span hosts, some
  // host has two or more of them and none turned it off; else shared memory when the
  // members share it; else `tcp` itself.
  expected<std::shared_ptr<gloo_transport::transport>> choose_transport(
      const std::shared_ptr<store>& setup, const std::shared_ptr<gloo_transport::tcp>& tcp,
      const std::string& address) {
    gloo_hier::open_options ho;
    ho.address = address;
    ho.rank = rank();
    ho.world_ranks = spec().global_ranks;
    ho.group = describe(*this);
    ho.timeout = spec().timeout;
    auto hier = gloo_transport::open_hierarchical(std::make_shared<prefix_store>(setup, "hier"),
                                                  choices_, ho, tcp);
    if (!hier)
      return make_error(hier.error().code(), "setting up shared memory within the hosts of ",
                        describe(*this), " failed: ", hier.error().message())
          .with_operation("collectives.gloo.connect");
    if (*hier) return std::move(*hier);
    gloo_shm::open_options so;
    so.rank = rank();
    so.size = size();
    so.world_ranks = spec().global_ranks;
    so.group = describe(*this);
    so.timeout = spec().timeout;
    prefix_store shm_store(setup, "shm");
    auto shm = gloo_transport::open_shared_memory(shm_store, so, tcp);
    if (!shm)
      return make_error(shm.error().code(), "setting up shared memory between the members of ",
                        describe(*this), " failed: ", shm.error().message())
          .with_operation("collectives.gloo.connect");
    if (*shm) return std::move(*shm);
    return std::shared_ptr<gloo_transport::transport>(tcp);
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
          // The transport divides avg's sum where the data is still in cache.
          return transport().allreduce(rc.step, t, op, fn);
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
          return transport().broadcast(rc.step, t, root);
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
          TROUPE_TRY(transport().reduce(rc.step, t, o.root, fn));
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
          return transport().allgather(rc.step, in, out);
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
          return transport().gather(rc.step, in, out, root);
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
          return transport().scatter(rc.step, in, out, root);
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
          TROUPE_TRY(transport().reduce_scatter(rc.step, in, out, op, fn));
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
          return transport().all_to_all(rc.step, in, out, uneven ? &l : nullptr);
        },
        -1, SIZE_MAX, in.nbytes());
  }

  work barrier(const barrier_options& o) override {
    return submit(
        "barrier", o.timeout,
        [this](const run_ctx& rc) -> expected<void> {
          if (size() == 1) return ok();
          return transport().barrier(rc.step);
        },
        -1, 0);
  }

  work send(tensor_view t, int dst, const p2p_options& o) override { return p2p(t, dst, o, true); }
  work recv(tensor_view t, int src, const p2p_options& o) override { return p2p(t, src, o, false); }

 private:
  expected<void> check(const tensor_view& t, std::string_view what) const {
    auto c = check_tensor(t, what, /*want_cuda=*/false);
    if (!c)
      return std::move(c).error().with_operation(strcat("collectives.gloo on ", describe(*this)));
    return ok();
  }

  work failed(expected<void> why) const { return work::completed(std::move(why)); }

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
          auto buf = tcp().post(t, peer, o.tag, is_send);
          if (!buf) return std::move(buf).error();
          *rc.handoff = handed_off{std::move(*buf), is_send, peer, rc.step.timeout};
          return ok();
        },
        peer);
  }

  // What each member asked for at connect (index: group rank; empty in a group of one).
  std::vector<gloo_hier::member_choice> choices_;
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
