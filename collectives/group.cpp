#include <troupe/collectives/group.hpp>

#include <algorithm>
#include <map>
#include <set>

#include <troupe/collectives/registry.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::collectives {

expected<std::shared_ptr<process_group>> init_world(const world_options& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    return make_error(errc::invalid_argument, "init_world: rank ", o.rank,
                      " is not in [0, world size ", o.size, ")");
  if (!o.store) return make_error(errc::invalid_argument, "init_world needs a store");
  group_spec s;
  s.name = o.name;
  s.rank = o.rank;
  s.size = o.size;
  for (int i = 0; i < o.size; ++i) s.global_ranks.push_back(i);
  s.root_store = o.store;
  s.timeout = o.timeout;
  return create_group(o.backend, s);
}

namespace {

// Builds the child (or lets the backend split natively); collective over the parent.
expected<std::shared_ptr<process_group>> make_child(process_group& parent,
                                                    const std::vector<int>& members, int color,
                                                    const std::string& name,
                                                    const subgroup_options& o) {
  const auto& ps = parent.spec();
  std::optional<group_spec> child;
  auto me = std::find(members.begin(), members.end(), parent.rank());
  if (me != members.end()) {
    group_spec s;
    s.name = name;
    s.rank = static_cast<int>(me - members.begin());
    s.size = static_cast<int>(members.size());
    for (int r : members) s.global_ranks.push_back(ps.global_ranks[static_cast<std::size_t>(r)]);
    s.root_store = ps.root_store;
    s.timeout = o.timeout;
    child = std::move(s);
  }
  std::string backend = o.backend.empty() ? std::string(parent.backend_name()) : o.backend;
  if (backend == parent.backend_name()) {
    auto native = parent.split_native(child ? &*child : nullptr, child ? color : -1);
    if (!native || *native) return native;
  }
  if (!child) return std::shared_ptr<process_group>();
  return create_group(backend, *child);
}

}  // namespace

expected<std::shared_ptr<process_group>> new_group(process_group& parent, std::vector<int> ranks,
                                                   const subgroup_options& o) {
  int id = parent.next_child_id();
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= parent.size())
      return make_error(errc::invalid_argument, "new_group: rank ", r, " is not in ",
                        describe(parent), " (ranks are 0 to ", parent.size() - 1, ")");
    if (!seen.insert(r).second)
      return make_error(errc::invalid_argument, "new_group: rank ", r, " is listed twice in ",
                        format_ranks(ranks));
  }
  if (ranks.empty()) return make_error(errc::invalid_argument, "new_group: no ranks given");
  return make_child(parent, ranks, 0, strcat(parent.name(), "/g", id), o);
}

expected<std::shared_ptr<process_group>> split(process_group& parent, int color, int key,
                                               const subgroup_options& o) {
  int id = parent.next_child_id();
  std::string base = strcat(parent.name(), "/s", id);
  bytes mine;
  byte_writer w(mine);
  w.u32(static_cast<std::uint32_t>(color));
  w.u32(static_cast<std::uint32_t>(key));
  auto all = all_gather(*parent.spec().root_store, base + "/colors", parent.rank(), parent.size(),
                        mine, o.timeout);
  if (!all) return std::move(all).error().with_operation("collectives.split");
  // color -> (key, parent rank)
  std::map<int, std::vector<std::pair<int, int>>> by_color;
  for (int r = 0; r < parent.size(); ++r) {
    byte_reader rd((*all)[static_cast<std::size_t>(r)]);
    auto c = rd.u32("color");
    auto k = rd.u32("key");
    if (!c || !k)
      return make_error(errc::protocol_error, "split of ", describe(parent), ": rank ", r,
                        " published a malformed color");
    int cc = static_cast<int>(*c);
    if (cc >= 0) by_color[cc].emplace_back(static_cast<int>(*k), r);
  }
  std::vector<int> members;
  if (color >= 0) {
    auto v = by_color[color];
    std::sort(v.begin(), v.end());
    for (auto& [k, r] : v) members.push_back(r);
  }
  return make_child(parent, members, color, strcat(base, "/c", color), o);
}

expected<parallel_layout> parallel_layout::make(int world_size, int model, int pipeline) {
  if (world_size < 1 || model < 1 || pipeline < 1)
    return make_error(errc::invalid_argument, "parallel layout: world size ", world_size,
                      ", model degree ", model, " and pipeline degree ", pipeline,
                      " must all be at least 1");
  if (world_size % (model * pipeline) != 0)
    return make_error(errc::invalid_argument, "parallel layout: world size ", world_size,
                      " is not divisible by model degree ", model, " x pipeline degree ", pipeline,
                      " = ", model * pipeline,
                      "; pick degrees whose product divides the world size");
  parallel_layout l;
  l.world = world_size;
  l.model = model;
  l.pipeline = pipeline;
  l.data = world_size / (model * pipeline);
  return l;
}

std::vector<int> parallel_layout::model_group(int rank) const {
  std::vector<int> out;
  int base = rank - rank % model;
  for (int i = 0; i < model; ++i) out.push_back(base + i);
  return out;
}

std::vector<int> parallel_layout::pipeline_group(int rank) const {
  std::vector<int> out;
  int block = model * pipeline;
  int base = (rank / block) * block + rank % model;
  for (int i = 0; i < pipeline; ++i) out.push_back(base + i * model);
  return out;
}

std::vector<int> parallel_layout::data_group(int rank) const {
  std::vector<int> out;
  int block = model * pipeline;
  for (int i = 0; i < data; ++i) out.push_back(rank % block + i * block);
  return out;
}

expected<parallel_groups> init_parallelism(process_group& world, const parallelism_options& o) {
  auto layout = parallel_layout::make(world.size(), o.model, o.pipeline);
  if (!layout) return std::move(layout).error();
  parallel_groups out;
  out.layout = *layout;
  int r = world.rank();
  // Every rank builds every group of each kind, in the same order, as the split is
  // collective; color = the index of the group that holds the rank.
  auto build = [&](int color, const std::string& backend) {
    subgroup_options so;
    so.backend = backend;
    so.timeout = o.timeout;
    return split(world, color, r, so);
  };
  const int block = layout->model * layout->pipeline;
  auto mp = build(r / layout->model, o.model_backend);
  if (!mp) return std::move(mp).error();
  auto pp = build((r / block) * layout->model + r % layout->model, o.pipeline_backend);
  if (!pp) return std::move(pp).error();
  auto dp = build(r % block, o.data_backend);
  if (!dp) return std::move(dp).error();
  out.model = std::move(*mp);
  out.pipeline = std::move(*pp);
  out.data = std::move(*dp);
  return out;
}

}  // namespace troupe::collectives
