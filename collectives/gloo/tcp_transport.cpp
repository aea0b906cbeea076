#include <troupe/collectives/gloo/tcp_transport.hpp>

#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <vector>

#include <troupe/collectives/gloo/gloo_errors.hpp>
#include <troupe/collectives/gloo/os_tuning.hpp>
#include <troupe/collectives/gloo/store_adapter.hpp>

namespace troupe::collectives::gloo_transport {

namespace {

// Gloo's buffer setters only use sizeof(T): pick an unsigned type of the element size.
template <class F>
void by_element_size(dtype t, F&& f) {
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
T* data_as(const tensor_view& t) {
  return static_cast<T*>(t.data);
}

// Point-to-point slots live above every slot Gloo's collectives use (prefix < 0x80).
constexpr std::uint64_t p2p_slot_base = std::uint64_t{0xe0} << 56;

}  // namespace

expected<std::shared_ptr<tcp>> tcp::connect(const tcp_options& o) {
  auto t = std::shared_ptr<tcp>(new tcp());
  t->rank_ = o.rank;
  t->size_ = o.size;
  TROUPE_TRY(gloo_errors::guard([&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    auto before = gloo_os::thread_ids();
    t->device_ = gloo::transport::tcp::CreateDevice(attr);
    gloo_os::batch_loop_threads(before, gloo_os::thread_ids());
    auto ctx = std::make_shared<gloo_mesh::context>(o.rank, o.size);
    ctx->setTimeout(o.timeout);
    gloo_store_adapter adapter(o.rendezvous, o.timeout);
    ctx->connect(adapter, t->device_, o.interrupt);
    gloo_os::size_local_send_buffers(*ctx);
    t->context_ = std::move(ctx);
  }));
  return t;
}

tcp::~tcp() = default;

gloo_direct::op_ctx tcp::direct_op(const op_step& s) const {
  return {*context_, gloo_direct::slot_of(s.tag), s.deadline()};
}

expected<void> tcp::allreduce(const op_step& s, tensor_view t, reduce_op op,
                              const cpu_reduce_fn& fn) {
  if (size_ == 1) return ok();
  TROUPE_TRY(gloo_direct::allreduce(direct_op(s), t, fn, scratch_));
  if (op == reduce_op::avg) cpu_divide(t, static_cast<std::size_t>(size_));
  return ok();
}

expected<void> tcp::broadcast(const op_step& s, tensor_view t, int root) {
  return gloo_errors::guard([&] {
    gloo::BroadcastOptions g(context_);
    by_element_size(t.type, [&](auto e) { g.setOutput(data_as<decltype(e)>(t), t.numel); });
    g.setRoot(root);
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::broadcast(g);
  });
}

expected<void> tcp::reduce(const op_step& s, tensor_view t, int root, const cpu_reduce_fn& fn) {
  return gloo_errors::guard([&] {
    // Gloo uses the output as scratch on every rank: keep non-roots' tensors intact.
    std::vector<std::byte> scratch;
    tensor_view target = t;
    if (rank_ != root) {
      scratch.assign(static_cast<std::byte*>(t.data), static_cast<std::byte*>(t.data) + t.nbytes());
      target.data = scratch.data();
    }
    gloo::ReduceOptions g(context_);
    by_element_size(t.type, [&](auto e) { g.setOutput(data_as<decltype(e)>(target), t.numel); });
    g.setRoot(root);
    g.setReduceFunction(fn);
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::reduce(g);
  });
}

expected<void> tcp::allgather(const op_step& s, tensor_view in, tensor_view out) {
  return gloo_direct::allgather(direct_op(s), in, out);
}

expected<void> tcp::gather(const op_step& s, tensor_view in, tensor_view out, int root) {
  const bool is_root = rank_ == root;
  return gloo_errors::guard([&] {
    gloo::GatherOptions g(context_);
    by_element_size(in.type, [&](auto e) {
      g.setInput(data_as<decltype(e)>(in), in.numel);
      if (is_root) g.setOutput(data_as<decltype(e)>(out), out.numel);
    });
    g.setRoot(root);
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::gather(g);
  });
}

expected<void> tcp::scatter(const op_step& s, tensor_view in, tensor_view out, int root) {
  const bool is_root = rank_ == root;
  return gloo_errors::guard([&] {
    gloo::ScatterOptions g(context_);
    by_element_size(out.type, [&](auto e) {
      using T = decltype(e);
      if (is_root) {
        std::vector<T*> blocks;
        for (int r = 0; r < size_; ++r)
          blocks.push_back(
              data_as<T>(in.slice(static_cast<std::size_t>(r) * out.numel, out.numel)));
        g.setInputs(blocks, out.numel);
      }
      g.setOutput(data_as<T>(out), out.numel);
    });
    g.setRoot(root);
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::scatter(g);
  });
}

expected<void> tcp::reduce_scatter(const op_step& s, tensor_view in, tensor_view out, reduce_op op,
                                   const cpu_reduce_fn& fn) {
  return reduce_scatter_by_allreduce(*this, s, rank_, in, out, op, fn);
}

expected<void> tcp::all_to_all(const op_step& s, tensor_view in, tensor_view out,
                               const a2a_layout* uneven) {
  return gloo_errors::guard([&] {
    if (uneven == nullptr) {
      if (in.numel == 0) return;
      gloo::AlltoallOptions g(context_);
      by_element_size(in.type, [&](auto e) {
        g.setInput(data_as<decltype(e)>(in), in.numel);
        g.setOutput(data_as<decltype(e)>(out), out.numel);
      });
      g.setTag(s.tag);
      g.setTimeout(s.timeout);
      gloo::alltoall(g);
      return;
    }
    std::vector<std::int64_t> sc(uneven->send_counts.begin(), uneven->send_counts.end());
    std::vector<std::int64_t> rcnt(uneven->recv_counts.begin(), uneven->recv_counts.end());
    // Gloo wants real buffers even for empty sides.
    std::uint64_t dummy_in = 0, dummy_out = 0;
    tensor_view i2 = in, o2 = out;
    if (in.numel == 0) i2.data = &dummy_in;
    if (out.numel == 0) o2.data = &dummy_out;
    gloo::AlltoallvOptions g(context_);
    by_element_size(in.type, [&](auto e) {
      g.setInput(data_as<decltype(e)>(i2), sc);
      g.setOutput(data_as<decltype(e)>(o2), rcnt);
    });
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::alltoallv(g);
  });
}

expected<void> tcp::barrier(const op_step& s) {
  return gloo_errors::guard([&] {
    gloo::BarrierOptions g(context_);
    g.setTag(s.tag);
    g.setTimeout(s.timeout);
    gloo::barrier(g);
  });
}

void tcp::mark_failed() noexcept {
  if (context_) (void)gloo_errors::guard([&] { context_->closeConnections(); });
}

void tcp::fail_pairs(const std::string& why) noexcept {
  if (!context_) return;
  for (int r = 0; r < context_->size; ++r)
    if (r != context_->rank) gloo_mesh::fail_pair(context_->getPair(r).get(), why);
}

expected<std::unique_ptr<gloo::transport::UnboundBuffer>> tcp::post(tensor_view t, int peer,
                                                                    std::uint32_t tag,
                                                                    bool is_send) {
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
  TROUPE_TRY(gloo_errors::guard([&] {
    buf = context_->createUnboundBuffer(t.data, t.nbytes());
    const std::uint64_t slot = p2p_slot_base | tag;
    if (is_send)
      buf->send(peer, slot);
    else
      buf->recv(peer, slot);
  }));
  return buf;
}

}  // namespace troupe::collectives::gloo_transport
