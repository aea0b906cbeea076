#include <troupe/collectives/autograd_all_to_all.hpp>

#include <numeric>
#include <string>
#include <utility>

namespace troupe::collectives {

namespace {

std::size_t total(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

std::string where(const std::shared_ptr<process_group>& g) {
  return g ? describe(*g) : std::string("a null group");
}

}  // namespace

autograd_all_to_all::autograd_all_to_all(std::shared_ptr<process_group> group)
    : group_(std::move(group)) {}

autograd_all_to_all::autograd_all_to_all(std::shared_ptr<process_group> group,
                                         std::vector<std::size_t> send,
                                         std::vector<std::size_t> recv)
    : group_(std::move(group)), send_counts_(std::move(send)), recv_counts_(std::move(recv)) {}

expected<autograd_all_to_all> autograd_all_to_all::make(std::shared_ptr<process_group> group,
                                                        std::vector<std::size_t> send_counts,
                                                        std::vector<std::size_t> recv_counts) {
  if (!group) return make_error(errc::invalid_argument, "autograd all_to_all: the group is null");
  const auto n = static_cast<std::size_t>(group->size());
  if (send_counts.size() != n)
    return make_error(errc::invalid_argument, "autograd all_to_all on ", describe(*group),
                      ": expected ", n, " send counts (one per rank), got ", send_counts.size());
  if (recv_counts.size() != n)
    return make_error(errc::invalid_argument, "autograd all_to_all on ", describe(*group),
                      ": expected ", n, " receive counts (one per rank), got ", recv_counts.size());
  return autograd_all_to_all(std::move(group), std::move(send_counts), std::move(recv_counts));
}

work autograd_all_to_all::forward(tensor_view input, tensor_view output,
                                  const autograd_all_to_all_options& o) {
  auto w = run("forward", input, output, send_counts_, recv_counts_, o);
  if (equal_splits() && input.numel == output.numel) forward_numel_ = input.numel;
  return w;
}

work autograd_all_to_all::backward(tensor_view grad_output, tensor_view grad_input,
                                   const autograd_all_to_all_options& o) {
  if (equal_splits() && forward_numel_ &&
      (grad_output.numel != *forward_numel_ || grad_input.numel != *forward_numel_))
    return work::completed(make_error(errc::invalid_argument, "autograd all_to_all backward on ",
                                      where(group_), ": expected gradients of ", *forward_numel_,
                                      " elements (the forward's size), got grad_output ",
                                      grad_output.numel, " and grad_input ", grad_input.numel),
                           "autograd all_to_all backward");
  // The swap: what the forward received is sent back, what it sent is received.
  return run("backward", grad_output, grad_input, recv_counts_, send_counts_, o);
}

work autograd_all_to_all::run(std::string_view what, tensor_view in, tensor_view out,
                              const std::vector<std::size_t>& sends,
                              const std::vector<std::size_t>& recvs,
                              const autograd_all_to_all_options& o) {
  const std::string label = "autograd all_to_all " + std::string(what);
  auto fail = [&](troupe::error e) { return work::completed(std::move(e), label); };
  const char* in_name = what == "forward" ? "input" : "grad_output";
  const char* out_name = what == "forward" ? "output" : "grad_input";
  if (!group_) return fail(make_error(errc::invalid_argument, label, ": the group is null"));
  if (in.type != out.type)
    return fail(make_error(errc::invalid_argument, label, " on ", describe(*group_), ": ", in_name,
                           " is ", to_string(in.type), " but ", out_name, " is ",
                           to_string(out.type)));
  all_to_all_options a;
  a.timeout = o.timeout;
  a.stream = o.stream;
  if (sends.empty()) {
    const auto n = static_cast<std::size_t>(group_->size());
    if (in.numel % n != 0)
      return fail(make_error(errc::invalid_argument, label, " on ", describe(*group_), ": ",
                             in_name, " has ", in.numel,
                             " elements, expected a multiple of the group size ", n));
    if (out.numel != in.numel)
      return fail(make_error(errc::invalid_argument, label, " on ", describe(*group_), ": ",
                             out_name, " has ", out.numel, " elements, expected ", in.numel,
                             " (the size of ", in_name, ")"));
  } else {
    const auto want_in = total(sends), want_out = total(recvs);
    if (in.numel != want_in)
      return fail(make_error(errc::invalid_argument, label, " on ", describe(*group_), ": ",
                             in_name, " has ", in.numel, " elements, expected ", want_in,
                             " (the sum of its split sizes)"));
    if (out.numel != want_out)
      return fail(make_error(errc::invalid_argument, label, " on ", describe(*group_), ": ",
                             out_name, " has ", out.numel, " elements, expected ", want_out,
                             " (the sum of its split sizes)"));
    a.send_counts = sends;
    a.recv_counts = recvs;
  }
  return group_->all_to_all(in, out, a);
}

}  // namespace troupe::collectives
