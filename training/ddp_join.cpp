// ddp under Join: the hook a joined rank runs. Each main_hook() makes the collectives of
// one step of the ranks still training, in the same order, with zeros as this rank's
// contribution: the counters, every bucket through the same comm hook when they reduce
// gradients, and the parameter all-reduce when they average. post_hook() gives every
// rank the weights of the highest rank among the last joiners.
#include <map>
#include <optional>
#include <vector>

#include <troupe/training/ddp.hpp>

namespace troupe::training {

using collectives::reduce_op;
using collectives::scratch_buffer;

class ddp::joined_hook final : public collectives::join_hook {
 public:
  joined_hook(ddp& d, bool sync_final_model) : d_(d), sync_final_model_(sync_final_model) {}

  expected<void> main_hook() override {
    auto f = d_.exchange_flags({0, 0, 0});
    if (!f) return std::move(f).error();
    if (f->grad_sync > 0) {
      double divisor = d_.divide_by_initial_world_size_ ? d_.world_size() : f->active;
      for (std::size_t b = 0; b < d_.plans_.size(); ++b) {
        auto zeros = zeroed(d_.plans_[b].type, d_.plans_[b].where, d_.plans_[b].numel);
        if (!zeros) return std::move(zeros).error();
        comm_bucket cb{b, *zeros, divisor, d_.group_.get(), d_.options_.timeout};
        auto r = d_.options_.hook(cb).get(d_.options_.timeout + wait_grace);
        if (!r) return std::move(r).error().with_operation("ddp: shadowing a bucket (join)");
      }
    }
    if (f->average > 0) {
      // The ranks still training sum their weights and divide by their number.
      for (auto& v : d_.values_) {
        auto zeros = zeroed(v.view().type, v.view().where, v.numel());
        if (!zeros) return std::move(zeros).error();
        auto w = d_.group_->allreduce(*zeros, {reduce_op::sum, d_.options_.timeout});
        if (auto r = w.wait(d_.options_.timeout + wait_grace); !r)
          return std::move(r).error().with_operation("ddp: shadowing averaging (join)");
      }
    }
    return ok();
  }

  expected<void> post_hook(bool is_last_joiner) override {
    if (!sync_final_model_ || d_.world_size() == 1) return ok();
    std::int32_t candidate = is_last_joiner ? d_.rank() : -1;
    auto buf = scratch_buffer::make(d_.device_, dtype::int32, 1);
    if (!buf) return std::move(buf).error();
    TROUPE_TRY(buf->write(&candidate));
    auto w = d_.group_->allreduce(buf->view(), {reduce_op::max, d_.options_.timeout});
    if (auto r = w.wait(d_.options_.timeout + wait_grace); !r)
      return std::move(r).error().with_operation("ddp: choosing the final model (join)");
    std::int32_t root = 0;
    TROUPE_TRY(buf->read(&root));
    return d_.broadcast_values(root);
  }

 private:
  // A zero-filled view of `numel` elements; the buffer is reused while it is big enough.
  expected<tensor_view> zeroed(dtype type, device where, std::size_t numel) {
    auto& slot = cache_[{type, where}];
    if (!slot || slot->view().numel < numel) {
      auto b = scratch_buffer::make(where, type, numel);  // zero-filled
      if (!b) return std::move(b).error();
      slot = std::move(*b);
    } else {
      if (host_zeros_.size() < slot->view().nbytes())
        host_zeros_.assign(slot->view().nbytes(), std::byte{0});
      TROUPE_TRY(slot->write(host_zeros_.data()));
    }
    return slot->view().slice(0, numel);
  }

  ddp& d_;
  bool sync_final_model_;
  std::map<std::pair<dtype, device>, std::optional<scratch_buffer>> cache_;
  std::vector<std::byte> host_zeros_;
};

expected<std::unique_ptr<collectives::join_hook>> ddp::join_hook(
    const collectives::join_args& args) {
  auto divide = args.get<bool>("divide_by_initial_world_size", true);
  if (!divide) return std::move(divide).error();
  auto sync_final = args.get<bool>("sync_final_model", true);
  if (!sync_final) return std::move(sync_final).error();
  if (in_step_)
    return make_error(errc::invalid_argument,
                      "ddp: a join scope was opened in the middle of a step; open it before "
                      "the training loop");
  divide_by_initial_world_size_ = *divide;
  return std::unique_ptr<collectives::join_hook>(new joined_hook(*this, *sync_final));
}

}  // namespace troupe::training
