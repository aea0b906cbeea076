#include <troupe/collectives/op_checks.hpp>

#include <numeric>

namespace troupe::collectives {

expected<void> check_root(const process_group& g, int root, std::string_view op) {
  if (root < 0 || root >= g.size())
    return make_error(errc::invalid_argument, op, " on ", describe(g), ": root ", root,
                      " is not a rank of the group (0 to ", g.size() - 1, ")");
  return ok();
}

expected<void> check_peer(const process_group& g, int peer, std::string_view op) {
  if (peer < 0 || peer >= g.size())
    return make_error(errc::invalid_argument, op, " on ", describe(g), ": peer ", peer,
                      " is not a rank of the group (0 to ", g.size() - 1, ")");
  if (peer == g.rank())
    return make_error(errc::invalid_argument, op, " on ", describe(g),
                      ": a rank cannot send to or receive from itself");
  return ok();
}

expected<void> check_reduce(const process_group& g, const tensor_view& t, reduce_op op,
                            std::string_view what) {
  if (!g.supports(t.type, op))
    return make_error(errc::unsupported, what, " on ", describe(g), ": reduce op ", to_string(op),
                      " is not supported on ", to_string(t.type), " tensors by the ",
                      g.backend_name(),
                      " backend (avg needs a floating dtype); pick another op or dtype");
  return ok();
}

expected<void> check_blocks(const process_group& g, const tensor_view& small,
                            const tensor_view& big, bool big_used, std::string_view op) {
  if (!big_used) return ok();
  if (big.type != small.type)
    return make_error(errc::invalid_argument, op, " on ", describe(g), ": dtypes differ (",
                      to_string(small.type), " and ", to_string(big.type), ")");
  if (big.numel != small.numel * static_cast<std::size_t>(g.size()))
    return make_error(errc::invalid_argument, op, " on ", describe(g), ": the large tensor has ",
                      big.numel, " elements but needs size ", g.size(), " x ", small.numel, " = ",
                      small.numel * static_cast<std::size_t>(g.size()));
  return ok();
}

expected<a2a_layout> check_all_to_all(const process_group& g, const tensor_view& in,
                                      const tensor_view& out, const all_to_all_options& o) {
  const auto n = static_cast<std::size_t>(g.size());
  a2a_layout l;
  if (in.type != out.type)
    return make_error(errc::invalid_argument, "all_to_all on ", describe(g), ": dtypes differ (",
                      to_string(in.type), " and ", to_string(out.type), ")");
  if (o.send_counts.empty() && o.recv_counts.empty()) {
    if (in.numel % n != 0 || out.numel != in.numel)
      return make_error(errc::invalid_argument, "all_to_all on ", describe(g),
                        ": equal splits need input and output of the same size, divisible "
                        "by the group size ",
                        n, " (got ", in.numel, " and ", out.numel, ")");
    l.send_counts.assign(n, in.numel / n);
    l.recv_counts.assign(n, in.numel / n);
  } else {
    if (o.send_counts.size() != n || o.recv_counts.size() != n)
      return make_error(errc::invalid_argument, "all_to_all on ", describe(g),
                        ": uneven splits need ", n, " send and ", n, " receive counts (got ",
                        o.send_counts.size(), " and ", o.recv_counts.size(), ")");
    l.send_counts = o.send_counts;
    l.recv_counts = o.recv_counts;
    auto s = std::accumulate(l.send_counts.begin(), l.send_counts.end(), std::size_t{0});
    auto r = std::accumulate(l.recv_counts.begin(), l.recv_counts.end(), std::size_t{0});
    if (s != in.numel || r != out.numel)
      return make_error(errc::invalid_argument, "all_to_all on ", describe(g),
                        ": the send counts add up to ", s, " (input has ", in.numel,
                        ") and the receive counts to ", r, " (output has ", out.numel, ")");
  }
  std::size_t so = 0, ro = 0;
  for (std::size_t i = 0; i < n; ++i) {
    l.send_offsets.push_back(so);
    l.recv_offsets.push_back(ro);
    so += l.send_counts[i];
    ro += l.recv_counts[i];
  }
  return l;
}

}  // namespace troupe::collectives
