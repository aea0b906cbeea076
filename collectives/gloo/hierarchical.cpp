#include <troupe/collectives/gloo/hierarchical.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>

#include <troupe/collectives/gloo/blocks.hpp>
#include <troupe/collectives/gloo/gloo_errors.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/log.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::collectives::gloo_hier {

member_choice choice_from_env(std::string host_key) {
  member_choice c;
  c.key = std::move(host_key);
  if (auto v = settings::gloo_host_key.value()) c.key = "set: " + *v;
  if (auto v = settings::gloo_hierarchical.value(); v && *v == "0") c.enabled = false;
  if (auto v = settings::gloo_hierarchical_min.value()) {
    std::uint64_t n = 0;
    std::string_view text(*v);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size())
      TROUPE_LOG(log_level::warn, "collectives", settings::gloo_hierarchical_min.variable, "='",
                 text, "' is not a byte count; using the default ", default_min_bytes);
    else
      c.min_bytes = n;
  }
  return c;
}

host_layout host_layout::from_keys(std::span<const std::string> keys, int rank) {
  host_layout l;
  std::vector<std::string> seen;  // the key of each host, in order of first appearance
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    const auto& key = keys[static_cast<std::size_t>(r)];
    auto it = std::find(seen.begin(), seen.end(), key);
    const auto h = static_cast<std::size_t>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(key);
      l.hosts.emplace_back();
    }
    if (r == rank) {
      l.host = static_cast<int>(h);
      l.local_rank = static_cast<int>(l.hosts[h].size());
    }
    l.hosts[h].push_back(r);
  }
  return l;
}

int host_layout::slices() const {
  std::size_t n = hosts.empty() ? 1 : hosts.front().size();
  for (const auto& h : hosts) n = std::min(n, h.size());
  return static_cast<int>(n);
}

bool host_layout::balanced() const {
  for (const auto& h : hosts)
    if (h.size() != hosts.front().size()) return false;
  return true;
}

bool host_layout::worthwhile() const {
  if (hosts.size() < 2) return false;
  for (const auto& h : hosts)
    if (h.size() >= 2) return true;
  return false;
}

std::vector<int> host_layout::slice_members(int k) const {
  std::vector<int> out;
  for (const auto& h : hosts) out.push_back(h[static_cast<std::size_t>(k)]);
  return out;
}

expected<std::unique_ptr<path>> path::open(const std::shared_ptr<store>& s, host_layout layout,
                                           const open_options& o) {
  auto p = std::unique_ptr<path>(new path());
  p->layout_ = std::move(layout);
  p->world_ranks_ = o.world_ranks;
  p->group_ = o.group;
  p->min_bytes_ = o.min_bytes;
  const auto& mine = p->layout_.hosts[static_cast<std::size_t>(p->layout_.host)];
  std::string why_not;
  if (mine.size() >= 2) {
    gloo_shm::open_options so;
    so.rank = p->layout_.local_rank;
    so.size = static_cast<int>(mine.size());
    so.world_ranks = p->world_of(mine);
    so.group =
        strcat(o.group, ", members on host ", p->layout_.host, " ", format_ranks(so.world_ranks));
    so.timeout = o.timeout;
    gloo_shm::apply_env(so);
    prefix_store host_store(s, strcat("host", p->layout_.host));
    auto seg = gloo_shm::segment::open(host_store, so);
    if (!seg) return std::move(seg).error();
    p->local_ = std::move(*seg);
    if (!p->local_) why_not = strcat("host ", p->layout_.host, "'s members could not share memory");
  }
  // Every host must have its segment, or no member takes this path.
  const std::byte ready[1] = {std::byte{why_not.empty() ? std::uint8_t{1} : std::uint8_t{0}}};
  auto all =
      all_gather(*s, "ready", o.rank, static_cast<int>(o.world_ranks.size()), ready, o.timeout);
  if (!all) return std::move(all).error();
  for (const auto& b : *all)
    if (b.size() != 1 || b[0] != std::byte{1}) {
      TROUPE_LOG(log_level::info, "collectives", o.group,
                 " spans hosts but one host's members cannot share memory: every allreduce "
                 "goes over TCP",
                 why_not.empty() ? "" : strcat(" (", why_not, ")"));
      return std::unique_ptr<path>();
    }
  // Each slice's members, one per host, connect a link to one another: host i's member
  // listens for host j's when i < j. Every member takes its pairs in the order of the
  // other host, so that no two wait on each other.
  const auto& l = p->layout_;
  if (l.local_rank < l.slices()) {
    const auto across = l.slice_members(l.local_rank);
    p->links_.resize(l.hosts.size());
    for (int j = 0; j < static_cast<int>(l.hosts.size()); ++j) {
      if (j == l.host) continue;
      const int peer = across[static_cast<std::size_t>(j)];
      gloo_link::link_options lo;
      lo.listens = l.host < j;
      lo.address = o.address;
      lo.peer = strcat("rank ", o.world_ranks[static_cast<std::size_t>(peer)], " on host ", j);
      lo.timeout = o.timeout;
      prefix_store link_store(
          s, strcat("link", l.local_rank, "/", std::min(l.host, j), "-", std::max(l.host, j)));
      auto link = gloo_link::link::open(link_store, lo);
      if (!link)
        return troupe::error(link.error().code(),
                             strcat("connecting to ", lo.peer,
                                    " for the hierarchical allreduce's step across hosts: ",
                                    link.error().message()));
      p->links_[static_cast<std::size_t>(j)] = std::move(*link);
    }
    TROUPE_LOG(log_level::debug, "collectives", o.group, ": slice ", l.local_rank,
               " crosses to the other hosts' members ", format_ranks(p->world_of(across)),
               " over links of its own");
  }
  return p;
}

std::vector<int> path::world_of(std::span<const int> group_ranks) const {
  std::vector<int> out;
  for (int r : group_ranks) out.push_back(world_ranks_[static_cast<std::size_t>(r)]);
  return out;
}

template <class F>
expected<void> path::run_step(const char* step, const std::vector<int>& who, F&& f) {
  auto r = gloo_errors::guard(std::forward<F>(f));
  if (r) return r;
  return troupe::error(r.error().code(), strcat("hierarchical allreduce, ", step, " with ranks ",
                                                format_ranks(who), ": ", r.error().message()));
}

expected<void> path::allreduce(tensor_view t, reduce_op op, const cpu_reduce_fn& fn,
                               clock::time_point deadline) {
  using gloo_blocks::block;
  const auto& l = layout_;
  const int k = l.local_rank, slices = l.slices(), local = l.local_size();
  const auto host_members = world_of(l.hosts[static_cast<std::size_t>(l.host)]);
  const std::vector<int> across = k < slices ? l.slice_members(k) : std::vector<int>{};
  const auto across_world = world_of(across);
  // Slice k, summed over every host, then divided for avg (by the group's size) while it is
  // in cache: each element of the result is divided once, by the member that reduced it
  // across hosts.
  auto across_hosts = [&](tensor_view part) -> expected<void> {
    const std::size_t divisor = op == reduce_op::avg ? world_ranks_.size() : 1;
    return run_step("across hosts", across_world,
                    [&] { return across_by_links(part, fn, divisor, deadline); });
  };

  // Balanced hosts and an even split: reduce-scatter, allreduce a slice across, allgather.
  if (l.balanced() && local >= 2 && t.numel % static_cast<std::size_t>(local) == 0) {
    // This member's block of the tensor, reduced in place within the host, then across,
    // then gathered in place: no scratch, and the allgather copies nothing of its own.
    const std::size_t per = t.numel / static_cast<std::size_t>(local);
    const tensor_view part = t.slice(static_cast<std::size_t>(k) * per, per);
    TROUPE_TRY(run_step("reduce-scatter within the host", host_members, [&] {
      return local_->reduce_scatter(++local_seq_, t, part, op, fn, deadline);
    }));
    TROUPE_TRY(across_hosts(part));
    return run_step("allgather within the host", host_members,
                    [&] { return local_->allgather(++local_seq_, part, t, deadline); });
  }

  // Otherwise: allreduce within the host, slice k across, a broadcast per slice.
  if (local >= 2)
    TROUPE_TRY(run_step("allreduce within the host", host_members,
                        [&] { return local_->allreduce(++local_seq_, t, op, fn, 1, deadline); }));
  if (k < slices) {
    const auto b = block(t.numel, slices, k);
    if (b.count > 0) TROUPE_TRY(across_hosts(t.slice(b.offset, b.count)));
  }
  if (local < 2) return ok();
  for (int j = 0; j < slices; ++j) {
    const auto b = block(t.numel, slices, j);
    if (b.count == 0) continue;
    TROUPE_TRY(run_step("broadcast within the host", host_members, [&] {
      return local_->broadcast(++local_seq_, t.slice(b.offset, b.count), j, deadline);
    }));
  }
  return ok();
}

expected<void> path::across_by_links(tensor_view part, const cpu_reduce_fn& fn, std::size_t divisor,
                                     clock::time_point deadline) {
  using gloo_blocks::block;
  using transfer = gloo_link::link::transfer;
  const int n = static_cast<int>(links_.size()), me = layout_.host;
  const std::size_t es = element_size(part.type);
  auto* data = static_cast<std::byte*>(part.data);
  auto link_to = [&](int j) { return links_[static_cast<std::size_t>(j)].get(); };
  if (n == 2) {
    // One exchange of the whole slice: host 0's sum op host 1's sum on both.
    const std::size_t bytes = part.nbytes();
    std::byte* theirs = received_.get(bytes);
    TROUPE_TRY(link_to(1 - me)->exchange(++link_seq_, {data, bytes}, {theirs, bytes}, deadline));
    if (me == 0)
      fn(data, data, theirs, part.numel);
    else
      fn(data, theirs, data, part.numel);
    if (divisor > 1) cpu_divide(part, divisor);
    return ok();
  }
  // More hosts: a reduce-scatter (host j folds block j of every host's slice, in host
  // order), then an allgather of the folded blocks, each a direct exchange with every peer.
  const auto mine = block(part.numel, n, me);
  const std::size_t mine_bytes = mine.count * es;
  std::byte* base = received_.get(mine_bytes * static_cast<std::size_t>(n - 1));
  auto theirs = [&](int j) {
    return base + mine_bytes * static_cast<std::size_t>(j < me ? j : j - 1);
  };
  std::byte* const own = data + mine.offset * es;
  std::vector<transfer> ts;
  for (int j = 0; j < n; ++j)
    if (j != me) {
      const auto b = block(part.numel, n, j);
      ts.push_back(
          transfer{link_to(j), {data + b.offset * es, b.count * es}, {theirs(j), mine_bytes}});
    }
  TROUPE_TRY(gloo_link::link::exchange_all(++link_seq_, ts, deadline));
  if (mine.count > 0) {
    // As gloo_direct folds: r0 op r1 op ..., the partial result in peer 0's buffer.
    if (me == 0) {
      for (int j = 1; j < n; ++j) fn(own, own, theirs(j), mine.count);
    } else {
      std::byte* acc = theirs(0);
      for (int j = 1; j < n; ++j)
        fn(j == n - 1 ? own : acc, acc, j == me ? own : theirs(j), mine.count);
    }
    if (divisor > 1) cpu_divide(part.slice(mine.offset, mine.count), divisor);
  }
  ts.clear();
  for (int j = 0; j < n; ++j)
    if (j != me) {
      const auto b = block(part.numel, n, j);
      ts.push_back(transfer{link_to(j), {own, mine_bytes}, {data + b.offset * es, b.count * es}});
    }
  return gloo_link::link::exchange_all(++link_seq_, ts, deadline);
}

void path::mark_failed() noexcept {
  if (local_) local_->mark_failed();
  for (auto& l : links_)
    if (l) l->close();
}

void path::abort() noexcept {
  if (local_) local_->abort();
  for (auto& l : links_)
    if (l) l->abort();
}

}  // namespace troupe::collectives::gloo_hier
