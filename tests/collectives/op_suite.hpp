// Runs every collective on every dtype through a group and checks the results against
// values computed locally. Shared by the in-process (threads) and multi-process tests.
// Returns "" on success, else a description of the first mismatch.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <troupe/collectives/process_group.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::testing {

inline const std::vector<dtype>& all_dtypes() {
  static const std::vector<dtype> v{dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                    dtype::int32,   dtype::int64,   dtype::uint8,   dtype::int8,
                                    dtype::int16,   dtype::boolean};
  return v;
}

// A typed buffer holding small integers exactly in every dtype.
class buffer {
 public:
  buffer(dtype t, std::size_t n) : type_(t), n_(n), raw_(n * element_size(t) + 8) {}
  tensor_view view() { return {raw_.data(), type_, n_, device::cpu()}; }
  std::size_t size() const { return n_; }
  void set(std::size_t i, double v) {
    void* p = raw_.data() + i * element_size(type_);
    switch (type_) {
      case dtype::float32:
        put(p, static_cast<float>(v));
        break;
      case dtype::float64:
        put(p, v);
        break;
      case dtype::float16:
        put(p, float_to_half(static_cast<float>(v)));
        break;
      case dtype::bfloat16:
        put(p, float_to_bfloat16(static_cast<float>(v)));
        break;
      case dtype::int32:
        put(p, static_cast<std::int32_t>(v));
        break;
      case dtype::int64:
        put(p, static_cast<std::int64_t>(v));
        break;
      case dtype::uint8:
        put(p, static_cast<std::uint8_t>(v));
        break;
      case dtype::int8:
        put(p, static_cast<std::int8_t>(v));
        break;
      case dtype::int16:
        put(p, static_cast<std::int16_t>(v));
        break;
      case dtype::boolean:
        // Raw bytes, not just 0 and 1: booleans are only moved, never reduced, and
        // distinct bytes show that every one arrived unchanged.
        put(p, static_cast<std::uint8_t>(v));
        break;
    }
  }
  double get(std::size_t i) const {
    const void* p = raw_.data() + i * element_size(type_);
    switch (type_) {
      case dtype::float32:
        return take<float>(p);
      case dtype::float64:
        return take<double>(p);
      case dtype::float16:
        return half_to_float(take<std::uint16_t>(p));
      case dtype::bfloat16:
        return bfloat16_to_float(take<std::uint16_t>(p));
      case dtype::int32:
        return take<std::int32_t>(p);
      case dtype::int64:
        return static_cast<double>(take<std::int64_t>(p));
      case dtype::uint8:
      case dtype::boolean:
        return take<std::uint8_t>(p);
      case dtype::int8:
        return take<std::int8_t>(p);
      case dtype::int16:
        return take<std::int16_t>(p);
    }
    return 0;
  }

 private:
  template <class T>
  static void put(void* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <class T>
  static T take(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  dtype type_;
  std::size_t n_;
  std::vector<std::byte> raw_;
};

inline bool close_enough(dtype t, double got, double want) {
  double tol = t == dtype::float16 || t == dtype::bfloat16 ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// A value every dtype holds exactly (0..63).
inline double ident(int rank, std::size_t i) {
  return static_cast<double>((rank * 7 + static_cast<int>(i)) % 64);
}
// Small operands for reductions (1 or 2), so products stay exact.
inline double operand(int rank, std::size_t i) {
  return 1.0 + static_cast<double>((rank + static_cast<int>(i)) % 2);
}

inline std::string run_op_suite(process_group& g, duration timeout) {
  const int n = g.size(), me = g.rank();
  const std::size_t k = 5;  // elements per rank block
  auto wait = [&](work w, const std::string& what) -> std::string {
    auto r = w.wait(timeout + std::chrono::seconds(5));
    return r ? std::string() : strcat(what, ": ", r.error().to_string());
  };
  // A dtype/op pair the group does not support must fail with unsupported, not run.
  auto refused = [&](work w, const std::string& what, dtype t) -> std::string {
    auto r = w.wait(timeout);
    if (r || r.error().code() != errc::unsupported)
      return strcat(what, " on ", to_string(t), " should be unsupported");
    return {};
  };
  auto mismatch = [&](const std::string& what, dtype t, std::size_t i, double got, double want) {
    return strcat(what, " on ", to_string(t), " at rank ", me, " element ", i, ": got ", got,
                  ", want ", want);
  };
  for (dtype t : all_dtypes()) {
    // allreduce, every op
    for (reduce_op op :
         {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product}) {
      buffer b(t, k);
      for (std::size_t i = 0; i < k; ++i) b.set(i, operand(me, i));
      allreduce_options o{op, timeout};
      auto w = g.allreduce(b.view(), o);
      if (!g.supports(t, op)) {
        if (auto e = refused(std::move(w), strcat("allreduce ", to_string(op)), t); !e.empty())
          return e;
        continue;
      }
      if (auto e = wait(std::move(w), strcat("allreduce ", to_string(op))); !e.empty()) return e;
      for (std::size_t i = 0; i < k; ++i) {
        double want = op == reduce_op::product ? 1
                      : op == reduce_op::min   ? 1e9
                      : op == reduce_op::max   ? -1e9
                                               : 0;
        for (int r = 0; r < n; ++r) {
          double v = operand(r, i);
          if (op == reduce_op::sum || op == reduce_op::avg) want += v;
          if (op == reduce_op::product) want *= v;
          if (op == reduce_op::min) want = std::min(want, v);
          if (op == reduce_op::max) want = std::max(want, v);
        }
        if (op == reduce_op::avg) want /= n;
        if (!close_enough(t, b.get(i), want))
          return mismatch(strcat("allreduce ", to_string(op)), t, i, b.get(i), want);
      }
    }
    // broadcast from the last rank
    {
      buffer b(t, k);
      for (std::size_t i = 0; i < k; ++i) b.set(i, ident(me, i));
      if (auto e = wait(g.broadcast(b.view(), {n - 1, timeout}), "broadcast"); !e.empty()) return e;
      for (std::size_t i = 0; i < k; ++i)
        if (b.get(i) != ident(n - 1, i))
          return mismatch("broadcast", t, i, b.get(i), ident(n - 1, i));
    }
    // reduce (max) to rank 0; the others keep their input
    {
      buffer b(t, k);
      for (std::size_t i = 0; i < k; ++i) b.set(i, ident(me, i));
      auto w = g.reduce(b.view(), {0, reduce_op::max, timeout});
      if (!g.supports(t, reduce_op::max)) {
        if (auto e = refused(std::move(w), "reduce max", t); !e.empty()) return e;
      } else if (auto e = wait(std::move(w), "reduce"); !e.empty()) {
        return e;
      } else
        for (std::size_t i = 0; i < k; ++i) {
          double want = ident(me, i);
          if (me == 0)
            for (int r = 0; r < n; ++r) want = std::max(want, ident(r, i));
          if (b.get(i) != want) return mismatch("reduce", t, i, b.get(i), want);
        }
    }
    // allgather and gather (to the middle rank)
    for (bool all : {true, false}) {
      int root = n / 2;
      buffer in(t, k), out(t, k * static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < k; ++i) in.set(i, ident(me, i));
      auto w = all ? g.allgather(in.view(), out.view(), {timeout})
                   : g.gather(in.view(), out.view(), {root, timeout});
      if (auto e = wait(std::move(w), all ? "allgather" : "gather"); !e.empty()) return e;
      if (all || me == root)
        for (int r = 0; r < n; ++r)
          for (std::size_t i = 0; i < k; ++i) {
            auto at = static_cast<std::size_t>(r) * k + i;
            if (out.get(at) != ident(r, i))
              return mismatch(all ? "allgather" : "gather", t, at, out.get(at), ident(r, i));
          }
    }
    // scatter from rank 0
    {
      buffer in(t, k * static_cast<std::size_t>(n)), out(t, k);
      for (std::size_t i = 0; i < in.size(); ++i) in.set(i, static_cast<double>(i % 64));
      if (auto e = wait(g.scatter(in.view(), out.view(), {0, timeout}), "scatter"); !e.empty())
        return e;
      for (std::size_t i = 0; i < k; ++i) {
        double want = static_cast<double>((static_cast<std::size_t>(me) * k + i) % 64);
        if (out.get(i) != want) return mismatch("scatter", t, i, out.get(i), want);
      }
    }
    // reduce_scatter (sum)
    {
      buffer in(t, k * static_cast<std::size_t>(n)), out(t, k);
      for (std::size_t i = 0; i < in.size(); ++i) in.set(i, operand(me, i));
      auto w = g.reduce_scatter(in.view(), out.view(), {reduce_op::sum, timeout});
      if (!g.supports(t, reduce_op::sum)) {
        if (auto e = refused(std::move(w), "reduce_scatter sum", t); !e.empty()) return e;
      } else if (auto e = wait(std::move(w), "reduce_scatter"); !e.empty()) {
        return e;
      } else
        for (std::size_t i = 0; i < k; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += operand(r, static_cast<std::size_t>(me) * k + i);
          if (out.get(i) != want) return mismatch("reduce_scatter", t, i, out.get(i), want);
        }
    }
    // all_to_all, equal blocks: element i of the block for rank j is (me * 7 + j + i) % 64
    {
      buffer in(t, k * static_cast<std::size_t>(n)), out(t, k * static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < k; ++i)
          in.set(static_cast<std::size_t>(j) * k + i, ident(me, static_cast<std::size_t>(j) + i));
      if (auto e = wait(g.all_to_all(in.view(), out.view(), {{}, {}, timeout}), "all_to_all");
          !e.empty())
        return e;
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < k; ++i) {
          auto at = static_cast<std::size_t>(j) * k + i;
          double want = ident(j, static_cast<std::size_t>(me) + i);
          if (out.get(at) != want) return mismatch("all_to_all", t, at, out.get(at), want);
        }
    }
    // all_to_all, uneven: rank a sends (a + b) % 3 elements to rank b
    {
      auto count = [](int a, int b) { return static_cast<std::size_t>((a + b) % 3); };
      all_to_all_options o;
      o.timeout = timeout;
      std::size_t sin = 0, sout = 0;
      for (int j = 0; j < n; ++j) {
        o.send_counts.push_back(count(me, j));
        o.recv_counts.push_back(count(j, me));
        sin += count(me, j);
        sout += count(j, me);
      }
      buffer in(t, sin), out(t, sout);
      std::size_t at = 0;
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count(me, j); ++i)
          in.set(at++, ident(me, static_cast<std::size_t>(j) + i));
      if (auto e = wait(g.all_to_all(in.view(), out.view(), o), "uneven all_to_all"); !e.empty())
        return e;
      at = 0;
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count(j, me); ++i, ++at) {
          double want = ident(j, static_cast<std::size_t>(me) + i);
          if (out.get(at) != want) return mismatch("uneven all_to_all", t, at, out.get(at), want);
        }
    }
    // send/recv around a ring, both posted before either is waited on; odd ranks post the
    // receive first, as a backend that runs point-to-point in call order on one stream
    // (nccl) needs
    if (n > 1) {
      buffer out(t, k), in(t, k);
      for (std::size_t i = 0; i < k; ++i) out.set(i, ident(me, i));
      int next = (me + 1) % n, prev = (me + n - 1) % n;
      work ws, wr;
      if (me % 2 == 1) wr = g.recv(in.view(), prev, {3, timeout});
      ws = g.send(out.view(), next, {3, timeout});
      if (me % 2 == 0) wr = g.recv(in.view(), prev, {3, timeout});
      if (auto e = wait(std::move(ws), "send"); !e.empty()) return e;
      if (auto e = wait(std::move(wr), "recv"); !e.empty()) return e;
      for (std::size_t i = 0; i < k; ++i)
        if (in.get(i) != ident(prev, i)) return mismatch("recv", t, i, in.get(i), ident(prev, i));
    }
  }
  // Larger transfers between the processes: 256 KiB per broadcast and per allgather block,
  // and a reduce_scatter into each rank's own block of its input (in place).
  {
    const std::size_t big = 65536;  // float32 elements: 256 KiB
    auto fval = [](int r, std::size_t i) { return static_cast<float>(ident(r, i) + r); };
    std::vector<float> b(big);
    for (std::size_t i = 0; i < big; ++i) b[i] = fval(me, i);
    if (auto e = wait(g.broadcast(tensor_view::of(std::span(b)), {0, timeout}), "broadcast 256K");
        !e.empty())
      return e;
    for (std::size_t i = 0; i < big; ++i)
      if (b[i] != fval(0, i))
        return mismatch("broadcast 256K", dtype::float32, i, b[i], fval(0, i));
    std::vector<float> own(big), all(big * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < big; ++i) own[i] = fval(me, i);
    if (auto e = wait(g.allgather(tensor_view::of(std::span(own)), tensor_view::of(std::span(all)),
                                  {timeout}),
                      "allgather 256K");
        !e.empty())
      return e;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < big; ++i)
        if (all[static_cast<std::size_t>(r) * big + i] != fval(r, i))
          return mismatch(strcat("allgather 256K block ", r), dtype::float32, i,
                          all[static_cast<std::size_t>(r) * big + i], fval(r, i));
    std::vector<float> rs(big * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<float>(operand(me, i));
    auto mine = tensor_view::of(std::span(rs)).slice(static_cast<std::size_t>(me) * big, big);
    if (auto e =
            wait(g.reduce_scatter(tensor_view::of(std::span(rs)), mine, {reduce_op::sum, timeout}),
                 "reduce_scatter in place");
        !e.empty())
      return e;
    for (std::size_t i = 0; i < big; ++i) {
      const std::size_t at = static_cast<std::size_t>(me) * big + i;
      double want = 0;
      for (int r = 0; r < n; ++r) want += operand(r, at);
      if (rs[at] != want)
        return mismatch("reduce_scatter in place", dtype::float32, i, rs[at], want);
    }
  }
  if (auto e = wait(g.barrier({timeout}), "barrier"); !e.empty()) return e;
  return {};
}

}  // namespace troupe::collectives::testing
