#include <troupe/collectives/gloo/direct.hpp>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include <troupe/collectives/gloo/blocks.hpp>
#include <troupe/collectives/gloo/gloo_errors.hpp>

namespace troupe::collectives::gloo_direct {

namespace {

using buffer_ptr = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Segments of the pipelined allreduce: at most 1 MiB (Gloo grows a connection's send
// buffer to the largest message it sent, so smaller segments leave more of each write to
// the event-loop thread), at least two per block so that folding one overlaps receiving
// the next, and not below 64 KiB, where the rendezvous per segment starts to count.
constexpr std::size_t max_segment_bytes = 1 << 20;
constexpr std::size_t min_segment_bytes = 64 << 10;

// Receive slots per peer in the reduce-scatter: segment k lands in slot k % depth, which
// is posted again once segment k has been folded. Three keeps two segments arriving while
// one is folded; the ring stays small enough (3 MiB per peer) to be reused from cache.
constexpr std::size_t receive_depth = 3;

std::chrono::milliseconds left(const op_ctx& op) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

// A wait that returned false was ended by abort(): as a broken connection, in the words
// gloo_errors::error_of gives Gloo's own errors.
troupe::error direct_failure(const char* what) {
  return troupe::error(errc::connection_lost, std::string("gloo: ") + what);
}

expected<void> wait_recv(const op_ctx& op, gloo::transport::UnboundBuffer& b) {
  if (!b.waitRecv(left(op))) return direct_failure("a receive was aborted");
  return ok();
}

expected<void> wait_send(const op_ctx& op, gloo::transport::UnboundBuffer& b) {
  if (!b.waitSend(left(op))) return direct_failure("a send was aborted");
  return ok();
}

using gloo_blocks::block;

// The participants of an operation: n of them, this one numbered `me`; participant r is
// context rank `peer(r)`.
struct participants {
  int n;
  int me;
  std::span<const int> map;
  int peer(int r) const { return map.empty() ? r : map[static_cast<std::size_t>(r)]; }
};

expected<participants> participants_of(const op_ctx& op) {
  if (op.ranks.empty()) return participants{op.context.size, op.context.rank, {}};
  const auto it = std::find(op.ranks.begin(), op.ranks.end(), op.context.rank);
  if (it == op.ranks.end())
    return direct_failure("a direct operation's rank map does not hold this rank");
  return participants{static_cast<int>(op.ranks.size()), static_cast<int>(it - op.ranks.begin()),
                      op.ranks};
}

// Folds the contributions of ranks 0..n-1 to one stretch of `bytes` bytes in rank order:
// contribution r is `own` for r == me, else `peer(r)`. The result lands in `own`;
// `acc` (a stretch no longer needed, here peer 0's) holds the partial result when
// me != 0, so every rank evaluates the same expression.
template <class Peer>
void fold(const cpu_reduce_fn& fn, int n, int me, std::byte* own, Peer peer, std::size_t elems) {
  if (me == 0) {
    for (int r = 1; r < n; ++r) fn(own, own, peer(r), elems);
    return;
  }
  std::byte* acc = peer(0);
  for (int r = 1; r < n; ++r) {
    const std::byte* c = r == me ? own : peer(r);
    fn(r == n - 1 ? own : acc, acc, c, elems);
  }
}

expected<void> exchange_allreduce(const op_ctx& op, const participants& p, tensor_view t,
                                  const cpu_reduce_fn& fn, scratch& s) {
  auto& ctx = op.context;
  const int n = p.n, me = p.me;
  const std::size_t bytes = t.nbytes();
  // One scratch slot per peer (peers before this rank first): n - 1 of them.
  std::byte* base = s.get(bytes * static_cast<std::size_t>(n - 1));
  auto slot_of_peer = [&](int r) {
    return base + bytes * static_cast<std::size_t>(r < me ? r : r - 1);
  };
  std::vector<buffer_ptr> in(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    if (r != me) {
      in[static_cast<std::size_t>(r)] = ctx.createUnboundBuffer(slot_of_peer(r), bytes);
      in[static_cast<std::size_t>(r)]->recv(p.peer(r), op.slot);
    }
  auto out = ctx.createUnboundBuffer(t.data, bytes);
  for (int i = 1; i < n; ++i) out->send(p.peer((me + i) % n), op.slot);
  for (int r = 0; r < n; ++r)
    if (r != me) TROUPE_TRY(wait_recv(op, *in[static_cast<std::size_t>(r)]));
  // The tensor is the send source: it may change only once every send has left.
  for (int i = 1; i < n; ++i) TROUPE_TRY(wait_send(op, *out));
  fold(fn, n, me, static_cast<std::byte*>(t.data), slot_of_peer, t.numel);
  return ok();
}

expected<void> pipelined_allreduce(const op_ctx& op, const participants& p, tensor_view t,
                                   const cpu_reduce_fn& fn, scratch& s) {
  auto& ctx = op.context;
  const int n = p.n, me = p.me;
  const std::size_t esize = element_size(t.type);
  const auto mine = block(t.numel, n, me);
  // The same on every rank (from block 0, the largest), as both ends cut a block alike.
  const std::size_t half_block = (block(t.numel, n, 0).count * esize + 1) / 2;
  const std::size_t seg = std::max<std::size_t>(
      1, std::clamp(half_block, min_segment_bytes, max_segment_bytes) / esize);
  auto* data = static_cast<std::byte*>(t.data);
  const std::uint64_t rs_slot = op.slot, ag_slot = op.slot + 1;

  // Segment k of a block: [k * seg, min((k + 1) * seg, count)).
  auto segments = [&](std::size_t count) { return (count + seg - 1) / seg; };
  auto seg_len = [&](std::size_t count, std::size_t k) { return std::min(seg, count - k * seg); };
  const std::size_t my_segments = segments(mine.count);

  // Reduce-scatter receives: every peer's contribution to my block lands in a ring of
  // `depth` segment slots per peer, which stays in cache between the socket copy and the
  // fold (a scratch the size of the block would stream through memory twice more).
  const std::size_t depth = std::max<std::size_t>(1, std::min(my_segments, receive_depth));
  const std::size_t ring_bytes = depth * seg * esize;
  std::byte* base = s.get(ring_bytes * static_cast<std::size_t>(n));
  auto ring = [&](int r) { return base + ring_bytes * static_cast<std::size_t>(r); };
  std::vector<buffer_ptr> in(static_cast<std::size_t>(n));
  auto post_rs_recv = [&](int r, std::size_t k) {
    in[static_cast<std::size_t>(r)]->recv(p.peer(r), rs_slot, (k % depth) * seg * esize,
                                          seg_len(mine.count, k) * esize);
  };
  for (int r = 0; r < n; ++r) {
    if (r == me || mine.count == 0) continue;
    in[static_cast<std::size_t>(r)] = ctx.createUnboundBuffer(ring(r), ring_bytes);
    for (std::size_t k = 0; k < depth; ++k) post_rs_recv(r, k);
  }
  // Allgather receives: every peer's reduced block, straight into the tensor.
  auto out = ctx.createUnboundBuffer(t.data, t.nbytes());
  std::size_t out_recvs = 0, out_sends = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    auto theirs = block(t.numel, n, r);
    for (std::size_t k = 0; k < segments(theirs.count); ++k, ++out_recvs)
      out->recv(p.peer(r), ag_slot, (theirs.offset + k * seg) * esize,
                seg_len(theirs.count, k) * esize);
  }
  // Reduce-scatter sends, segment by segment so that every peer gets its first one early.
  std::size_t most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, segments(block(t.numel, n, r).count));
  for (std::size_t k = 0; k < most; ++k)
    for (int i = 1; i < n; ++i) {
      int r = (me + i) % n;
      auto theirs = block(t.numel, n, r);
      if (k >= segments(theirs.count)) continue;
      out->send(p.peer(r), rs_slot, (theirs.offset + k * seg) * esize,
                seg_len(theirs.count, k) * esize);
      ++out_sends;
    }
  // Fold each segment of my block as it completes, reuse its slots, then pass it on.
  for (std::size_t k = 0; k < my_segments; ++k) {
    for (int r = 0; r < n; ++r)
      if (r != me) TROUPE_TRY(wait_recv(op, *in[static_cast<std::size_t>(r)]));
    const std::size_t off = k * seg * esize, len = seg_len(mine.count, k);
    const std::size_t slot_off = (k % depth) * seg * esize;
    fold(
        fn, n, me, data + (mine.offset * esize) + off, [&](int r) { return ring(r) + slot_off; },
        len);
    if (k + depth < my_segments)
      for (int r = 0; r < n; ++r)
        if (r != me) post_rs_recv(r, k + depth);
    for (int i = 1; i < n; ++i, ++out_sends)
      out->send(p.peer((me + i) % n), ag_slot, mine.offset * esize + off, len * esize);
  }
  for (std::size_t i = 0; i < out_recvs; ++i) TROUPE_TRY(wait_recv(op, *out));
  for (std::size_t i = 0; i < out_sends; ++i) TROUPE_TRY(wait_send(op, *out));
  return ok();
}

}  // namespace

std::byte* scratch::get(std::size_t bytes) {
  if (bytes > size_) {
    data_.reset();  // release the old block before asking for the larger one
    data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
    size_ = bytes;
  }
  return data_.get();
}

std::uint64_t slot_of(std::uint32_t tag) {
  return (std::uint64_t{0x10} << 56) | (std::uint64_t{tag & 0xffffffu} << 8);
}

expected<void> allreduce(const op_ctx& op, tensor_view t, const cpu_reduce_fn& fn, scratch& s) {
  auto p = participants_of(op);
  if (!p) return std::move(p).error();
  if (p->n == 1 || t.numel == 0) return ok();
  return gloo_errors::guard([&] {
    const std::size_t limit = p->n == 2 ? exchange_pair_max_bytes : exchange_max_bytes;
    return t.nbytes() <= limit ? exchange_allreduce(op, *p, t, fn, s)
                               : pipelined_allreduce(op, *p, t, fn, s);
  });
}

expected<void> allgather(const op_ctx& op, tensor_view in, tensor_view out) {
  auto& ctx = op.context;
  auto found = participants_of(op);
  if (!found) return std::move(found).error();
  const auto& p = *found;
  const int n = p.n, me = p.me;
  const std::size_t bytes = in.nbytes();
  auto* dst = static_cast<std::byte*>(out.data);
  std::memcpy(dst + bytes * static_cast<std::size_t>(me), in.data, bytes);
  if (n == 1 || bytes == 0) return ok();
  return gloo_errors::guard([&]() -> expected<void> {
    auto into = ctx.createUnboundBuffer(out.data, out.nbytes());
    for (int r = 0; r < n; ++r)
      if (r != me) into->recv(p.peer(r), op.slot, bytes * static_cast<std::size_t>(r), bytes);
    auto from = ctx.createUnboundBuffer(in.data, bytes);
    for (int i = 1; i < n; ++i) from->send(p.peer((me + i) % n), op.slot);
    for (int i = 1; i < n; ++i) TROUPE_TRY(wait_recv(op, *into));
    for (int i = 1; i < n; ++i) TROUPE_TRY(wait_send(op, *from));
    return ok();
  });
}

}  // namespace troupe::collectives::gloo_direct
