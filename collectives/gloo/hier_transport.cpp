#include <troupe/collectives/gloo/hier_transport.hpp>

#include <string>
#include <vector>

namespace troupe::collectives::gloo_transport {

namespace {

class hier_transport final : public over_tcp {
 public:
  hier_transport(std::unique_ptr<gloo_hier::path> path, std::shared_ptr<tcp> tcp)
      : over_tcp(std::move(tcp)), path_(std::move(path)) {}

  std::string_view name() const noexcept override { return "hierarchical"; }
  // Only the operations that reduce through allreduce, with enough bytes, take the path.
  std::string_view carrier(std::string_view op, std::size_t bytes) const noexcept override {
    const bool reduces = op == "allreduce" || op == "reduce_scatter";
    return reduces && path_->wants(bytes) ? "hierarchical" : "tcp";
  }

  expected<void> allreduce(const op_step& s, tensor_view t, reduce_op op,
                           const cpu_reduce_fn& fn) override {
    if (tcp_->size() == 1) return ok();
    if (!path_->wants(t.nbytes())) return tcp_->allreduce(s, t, op, fn);
    return path_->allreduce(t, op, fn, s.deadline());
  }
  expected<void> reduce_scatter(const op_step& s, tensor_view in, tensor_view out, reduce_op op,
                                const cpu_reduce_fn& fn) override {
    return reduce_scatter_by_allreduce(*this, s, tcp_->rank(), in, out, op, fn);
  }

  void mark_failed() noexcept override {
    path_->mark_failed();
    over_tcp::mark_failed();
  }
  void abort() noexcept override { path_->abort(); }

 private:
  std::unique_ptr<gloo_hier::path> path_;
};

}  // namespace

expected<std::shared_ptr<transport>> open_hierarchical(
    const std::shared_ptr<store>& s, std::span<const gloo_hier::member_choice> choices,
    gloo_hier::open_options o, std::shared_ptr<tcp> tcp) {
  if (choices.empty()) return std::shared_ptr<transport>();  // a group of one
  std::vector<std::string> keys;
  bool enabled = true;
  for (const auto& c : choices) {
    keys.push_back(c.key);
    enabled = enabled && c.enabled;
  }
  auto layout = gloo_hier::host_layout::from_keys(keys, o.rank);
  if (!enabled || !layout.worthwhile()) return std::shared_ptr<transport>();
  o.min_bytes = choices.front().min_bytes;
  auto path = gloo_hier::path::open(s, std::move(layout), o);
  if (!path) return std::move(path).error();
  if (!*path) return std::shared_ptr<transport>();
  return std::shared_ptr<transport>(
      std::make_shared<hier_transport>(std::move(*path), std::move(tcp)));
}

}  // namespace troupe::collectives::gloo_transport
