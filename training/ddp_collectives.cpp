// ddp: the collectives of the strategy besides gradient buckets: the cross-rank check of
// the parameter list, weight broadcast and averaging, the per-step join counters, and the
// barrier / broadcast / reduce helpers.
#include <array>

#include <troupe/training/ddp.hpp>

namespace troupe::training {

using collectives::reduce_op;
using collectives::scratch_buffer;

namespace {

std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

expected<void> ddp::check_across_ranks() {
  std::uint64_t h = 14695981039346656037ull;
  std::int64_t numel = 0;
  for (auto& p : params_) {
    h = fnv1a(h, p.name.data(), p.name.size());
    auto t = static_cast<std::uint8_t>(p.value.type);
    h = fnv1a(h, &t, 1);
    h = fnv1a(h, &p.value.numel, sizeof p.value.numel);
    numel += static_cast<std::int64_t>(p.value.numel);
  }
  std::array<std::int64_t, 3> mine{static_cast<std::int64_t>(params_.size()), numel,
                                   static_cast<std::int64_t>(h)};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world_size()));
  // On the parameters' device: an NCCL group reduces GPU memory only.
  auto in = scratch_buffer::make(device_, dtype::int64, mine.size());
  if (!in) return std::move(in).error().with_operation("ddp.make");
  auto out = scratch_buffer::make(device_, dtype::int64, all.size());
  if (!out) return std::move(out).error().with_operation("ddp.make");
  TROUPE_TRY(in->write(mine.data()));
  auto w = group_->allgather(in->view(), out->view(), {options_.timeout});
  if (auto r = w.wait(options_.timeout + wait_grace); !r) {
    (void)w.wait(options_.timeout);  // let the group finish with the buffers
    return std::move(r).error().with_operation("ddp.make");
  }
  TROUPE_TRY(out->read(all.data()));
  for (int r = 1; r < world_size(); ++r) {
    auto* o = &all[3 * static_cast<std::size_t>(r)];
    if (o[0] != all[0] || o[1] != all[1] || o[2] != all[2])
      return make_error(
          errc::invalid_argument, "ddp.make: rank ", r, " has ", o[0], " parameters with ", o[1],
          " elements, rank 0 has ", all[0], " with ", all[1],
          (o[0] == all[0] && o[1] == all[1] ? " (same counts, but names, dtypes or order differ)"
                                            : ""),
          "; every rank must pass the same parameter list");
  }
  return ok();
}

expected<void> ddp::broadcast_values(int root) {
  for (auto& v : values_) {
    v.pack();
    auto w = group_->broadcast(v.view(), {root, options_.timeout});
    if (auto r = w.wait(options_.timeout + wait_grace); !r)
      return std::move(r).error().with_operation("ddp: broadcast of the parameters");
    v.unpack();
  }
  return ok();
}

expected<void> ddp::average_values(double divisor) {
  for (auto& v : values_) {
    v.pack();
    bool native = divisor == world_size() && group_->supports(v.view().type, reduce_op::avg);
    auto w =
        group_->allreduce(v.view(), {native ? reduce_op::avg : reduce_op::sum, options_.timeout});
    if (auto r = w.wait(options_.timeout + wait_grace); !r)
      return std::move(r).error().with_operation("ddp: parameter averaging");
    if (!native) TROUPE_TRY(scale(v.view(), 1.0 / divisor));
    v.unpack();
  }
  return ok();
}

expected<ddp::step_flags> ddp::exchange_flags(step_flags mine) {
  auto buf = scratch_buffer::make(device_, dtype::int32, 3);
  if (!buf) return std::move(buf).error();
  std::array<std::int32_t, 3> v{mine.active, mine.grad_sync, mine.average};
  TROUPE_TRY(buf->write(v.data()));
  auto w = group_->allreduce(buf->view(), {reduce_op::sum, options_.timeout});
  if (auto r = w.wait(options_.timeout + wait_grace); !r) {
    // Let the group finish with the buffer before it goes away.
    (void)w.wait(options_.timeout);
    return std::move(r).error().with_operation("ddp: join counters");
  }
  TROUPE_TRY(buf->read(v.data()));
  return step_flags{v[0], v[1], v[2]};
}

expected<void> ddp::barrier() {
  auto w = group_->barrier({options_.timeout});
  if (auto r = w.wait(options_.timeout + wait_grace); !r)
    return std::move(r).error().with_operation("ddp.barrier");
  return ok();
}

expected<bytes> ddp::broadcast_bytes(const bytes& data, int src) {
  if (src < 0 || src >= world_size())
    return make_error(errc::invalid_argument, "ddp.broadcast: source rank ", src, " is not in [0, ",
                      world_size(), ")");
  // Through buffers on the parameters' device (host memory for the CPU): an NCCL group
  // moves GPU memory only.
  std::int64_t n = rank() == src ? static_cast<std::int64_t>(data.size()) : 0;
  auto size = scratch_buffer::make(device_, dtype::int64, 1);
  if (!size) return std::move(size).error().with_operation("ddp.broadcast");
  TROUPE_TRY(size->write(&n));
  auto w = group_->broadcast(size->view(), {src, options_.timeout});
  if (auto r = w.wait(options_.timeout + wait_grace); !r) {
    (void)w.wait(options_.timeout);
    return std::move(r).error().with_operation("ddp.broadcast");
  }
  TROUPE_TRY(size->read(&n));
  bytes out = rank() == src ? data : bytes(static_cast<std::size_t>(n));
  if (n == 0) return out;
  auto body = scratch_buffer::make(device_, dtype::uint8, out.size());
  if (!body) return std::move(body).error().with_operation("ddp.broadcast");
  TROUPE_TRY(body->write(out.data()));
  auto d = group_->broadcast(body->view(), {src, options_.timeout});
  if (auto r = d.wait(options_.timeout + wait_grace); !r) {
    (void)d.wait(options_.timeout);
    return std::move(r).error().with_operation("ddp.broadcast");
  }
  TROUPE_TRY(body->read(out.data()));
  return out;
}

expected<void> ddp::reduce(tensor_view t, reduce_op op) {
  if (op != reduce_op::sum && op != reduce_op::avg)
    return make_error(errc::invalid_argument, "ddp.reduce takes sum or avg (the mean), not ",
                      to_string(op));
  auto w = group_->allreduce(t, {op, options_.timeout});
  if (auto r = w.wait(options_.timeout + wait_grace); !r)
    return std::move(r).error().with_operation("ddp.reduce");
  return ok();
}

}  // namespace troupe::training
