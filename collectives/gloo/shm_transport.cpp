#include <troupe/collectives/gloo/shm_transport.hpp>

#include <troupe/collectives/gloo/gloo_errors.hpp>

namespace troupe::collectives::gloo_transport {

namespace {

bool views_overlap(const tensor_view& a, const tensor_view& b) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

class shm_transport final : public over_tcp {
 public:
  shm_transport(std::unique_ptr<gloo_shm::segment> segment, std::shared_ptr<tcp> tcp)
      : over_tcp(std::move(tcp)), segment_(std::move(segment)) {}

  std::string_view name() const noexcept override { return "shared memory"; }
  std::string_view carrier(std::string_view, std::size_t) const noexcept override {
    return "shared memory";
  }

  // Reduce, gather, scatter and all-to-all go over TCP (over_tcp); the rest through the
  // segment.
  expected<void> allreduce(const op_step& s, tensor_view t, reduce_op op,
                           const cpu_reduce_fn& fn) override {
    if (tcp_->size() == 1) return ok();
    const auto divisor = op == reduce_op::avg ? static_cast<std::size_t>(tcp_->size()) : 1;
    return gloo_errors::guard(
        [&] { return segment_->allreduce(s.seq, t, op, fn, divisor, s.deadline()); });
  }
  expected<void> broadcast(const op_step& s, tensor_view t, int root) override {
    return gloo_errors::guard([&] { return segment_->broadcast(s.seq, t, root, s.deadline()); });
  }
  expected<void> allgather(const op_step& s, tensor_view in, tensor_view out) override {
    return gloo_errors::guard([&] { return segment_->allgather(s.seq, in, out, s.deadline()); });
  }
  // The segment's own when `out` does not overlap `in` or is exactly this member's block of
  // it; else through its allreduce.
  expected<void> reduce_scatter(const op_step& s, tensor_view in, tensor_view out, reduce_op op,
                                const cpu_reduce_fn& fn) override {
    const bool own_block = out.data == static_cast<std::byte*>(in.data) +
                                           static_cast<std::size_t>(tcp_->rank()) * out.nbytes();
    if (tcp_->size() > 1 && (own_block || !views_overlap(in, out)))
      return gloo_errors::guard(
          [&] { return segment_->reduce_scatter(s.seq, in, out, op, fn, s.deadline()); });
    return reduce_scatter_by_allreduce(*this, s, tcp_->rank(), in, out, op, fn);
  }
  expected<void> barrier(const op_step& s) override {
    return gloo_errors::guard([&] { return segment_->barrier(s.seq, s.deadline()); });
  }

  void mark_failed() noexcept override {
    segment_->mark_failed();
    over_tcp::mark_failed();
  }
  void abort() noexcept override { segment_->abort(); }

 private:
  std::unique_ptr<gloo_shm::segment> segment_;
};

}  // namespace

expected<std::shared_ptr<transport>> open_shared_memory(store& s, gloo_shm::open_options o,
                                                        std::shared_ptr<tcp> tcp) {
  gloo_shm::apply_env(o);
  auto segment = gloo_shm::segment::open(s, o);
  if (!segment) return std::move(segment).error();
  if (!*segment) return std::shared_ptr<transport>();
  return std::shared_ptr<transport>(
      std::make_shared<shm_transport>(std::move(*segment), std::move(tcp)));
}

}  // namespace troupe::collectives::gloo_transport
