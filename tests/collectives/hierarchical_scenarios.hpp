// Scenarios of collectives_test_worker for the hierarchical allreduce: each rank process
// claims a host of its own choosing (TROUPE_GLOO_HOST_KEY) before it joins the group, so
// that one machine holds a group that looks like several hosts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::collectives::testing {

/// How ranks are placed on simulated hosts: "blocks" puts ranks 2h and 2h + 1 on host h,
/// "interleaved" puts the even ranks on host 0 and the odd ones on host 1.
inline int simulated_host(const std::string& placement, int rank) {
  return placement == "interleaved" ? rank % 2 : rank / 2;
}

/// Claims simulated host `host` for this process (before the group connects).
inline void claim_simulated_host(int host) {
  ::setenv("TROUPE_GLOO_HOST_KEY", ("simulated-host-" + std::to_string(host)).c_str(), 1);
}

namespace hier_detail {

// Rank r's element i of an exactly representable case, per op.
inline std::int64_t element(reduce_op op, int r, std::size_t i) {
  switch (op) {
    case reduce_op::max:
    case reduce_op::min:
      return static_cast<std::int64_t>((i + static_cast<std::size_t>(r) * 3) % 11) - 5;
    case reduce_op::product:
      return (i + static_cast<std::size_t>(r)) % 3 == 0 ? 2 : 1;
    default:
      return static_cast<std::int64_t>(r + 1) * static_cast<std::int64_t>(i % 5 + 1);
  }
}

inline double expected_value(reduce_op op, int size, std::size_t i) {
  double acc = static_cast<double>(element(op, 0, i));
  for (int r = 1; r < size; ++r) {
    const double v = static_cast<double>(element(op, r, i));
    switch (op) {
      case reduce_op::max:
        acc = std::max(acc, v);
        break;
      case reduce_op::min:
        acc = std::min(acc, v);
        break;
      case reduce_op::product:
        acc *= v;
        break;
      default:
        acc += v;
        break;
    }
  }
  return op == reduce_op::avg ? acc / size : acc;
}

template <class T>
std::string check_case(process_group& g, dtype type, reduce_op op, std::size_t n) {
  const int rank = g.rank(), size = g.size();
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(element(op, rank, i));
  auto r =
      g.allreduce(tensor_view{v.data(), type, n, device::cpu()}, {op, std::chrono::seconds(15)})
          .wait(std::chrono::seconds(20));
  const auto what = strcat(to_string(op), " of ", n, " ", to_string(type));
  if (!r) return strcat(what, ": ", r.error().to_string());
  for (std::size_t i = 0; i < n; ++i)
    if (static_cast<double>(v[i]) != expected_value(op, size, i))
      return strcat(what, ": element ", i, " is ", static_cast<double>(v[i]), " instead of ",
                    expected_value(op, size, i));
  return {};
}

// FNV-1a of the bytes.
inline std::uint64_t digest(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(p)[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace hier_detail

/// Every rank runs allreduces below and above the threshold (rank 0 set it to 256 KiB), of
/// sizes that the local world divides and does not, on several dtypes and ops, and checks
/// the values; a sum of inexact floats must come out bit-identical on every rank; and a
/// float sum whose bits tell the fold orders apart shows that large tensors fold host by
/// host and small ones in rank order. `placement` as in simulated_host(); the store is the test's.
inline std::string run_hierarchical_suite(store& s, process_group& g,
                                          const std::string& placement) {
  using hier_detail::check_case;
  const std::vector<std::size_t> sizes{1, 1000, 65536, 65537, 300001, std::size_t{1} << 20};
  for (std::size_t n : sizes) {
    for (auto op :
         {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min, reduce_op::product})
      if (auto e = check_case<float>(g, dtype::float32, op, n); !e.empty()) return e;
    if (auto e = check_case<double>(g, dtype::float64, reduce_op::sum, n); !e.empty()) return e;
    for (auto op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::product})
      if (auto e = check_case<std::int32_t>(g, dtype::int32, op, n); !e.empty()) return e;
    if (auto e = check_case<std::int64_t>(g, dtype::int64, reduce_op::sum, n); !e.empty()) return e;
  }
  // Inexact sums: every rank must hold the same bits.
  for (std::size_t n : {std::size_t{1000}, std::size_t{65536}, std::size_t{300001}}) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = 0.1f * static_cast<float>(g.rank() + 1) + static_cast<float>(i) * 1e-3f;
    auto r = g.allreduce(tensor_view::of(std::span(v)), {reduce_op::sum, std::chrono::seconds(15)})
                 .wait(std::chrono::seconds(20));
    if (!r) return strcat("inexact sum of ", n, ": ", r.error().to_string());
    const auto h = hier_detail::digest(v.data(), n * sizeof(float));
    bytes mine(sizeof h);
    std::memcpy(mine.data(), &h, sizeof h);
    auto all = all_gather(s, strcat("digest-", placement, "-", n), g.rank(), g.size(), mine,
                          std::chrono::seconds(20));
    if (!all) return strcat("exchanging digests: ", all.error().to_string());
    for (int q = 0; q < g.size(); ++q)
      if ((*all)[static_cast<std::size_t>(q)] != mine)
        return strcat("inexact sum of ", n, ": rank ", q, "'s result differs from rank ", g.rank(),
                      "'s in its bits");
  }
  // Fold order (two hosts of two): local rank 0 of host 0 adds 1, local rank 1 adds 0, both
  // members of host 1 add 2^-24. Host by host: 1 + 2^-23; in rank order the 2^-24 steps are
  // each lost to rounding (for either placement): 1.
  if (g.size() == 4) {
    const int host = simulated_host(placement, g.rank());
    // Rank 0 is the first member of host 0 in either placement.
    float mine = host == 1 ? std::ldexp(1.0f, -24) : (g.rank() == 0 ? 1.0f : 0.0f);
    for (std::size_t n : {std::size_t{1000}, std::size_t{65536}, std::size_t{65537}}) {
      std::vector<float> v(n, 0.0f);
      v[0] = mine;
      auto r =
          g.allreduce(tensor_view::of(std::span(v)), {reduce_op::sum, std::chrono::seconds(15)})
              .wait(std::chrono::seconds(20));
      if (!r) return strcat("fold-order probe of ", n, ": ", r.error().to_string());
      const float want = n * sizeof(float) >= (256u << 10) ? 1.0f + std::ldexp(1.0f, -23) : 1.0f;
      // In units of 2^-24 above 1, which the default formatting would round away.
      auto above_one = [](float x) { return std::ldexp(x - 1.0f, 24); };
      if (v[0] != want)
        return strcat("fold-order probe of ", n, " floats: 1 + ", above_one(v[0]),
                      " * 2^-24 instead of 1 + ", above_one(want), " * 2^-24 (",
                      want == 1.0f ? "rank order" : "host by host", ")");
    }
  }
  return {};
}

}  // namespace troupe::collectives::testing
