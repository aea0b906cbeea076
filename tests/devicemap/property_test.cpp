// Randomized properties over generated groups. Every group is built from its own
// std::mt19937 seeded with base_seed + index, so a failure names the exact group.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/devicemap/derive.hpp>
#include <troupe/devicemap/validate.hpp>
#include "helpers.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

constexpr std::uint32_t base_seed = 0x7d3a91u;
constexpr int group_count = 3000;

using rng = std::mt19937;

int uniform(rng& g, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
bool coin(rng& g, int percent) { return uniform(g, 1, 100) <= percent; }

/// Every device a worker with `count` GPUs may use.
std::vector<device> all_valid(int count) {
  std::vector<device> out{cpu()};
  for (int i = 0; i < count; ++i) out.push_back(cuda(i));
  return out;
}

/// The devices a map may use on a worker: its list when given, else all valid ones.
std::vector<device> usable(const worker_device_info& w) {
  return w.devices.empty() ? all_valid(w.device_count) : w.devices;
}

struct group {
  std::vector<worker_device_info> workers;
  bool has_unknown_targets = false;
};

/// A group that passes validation: static when it has no unknown targets.
group make_valid_group(rng& g, bool allow_unknown) {
  group out;
  const int n = uniform(g, 1, 6);
  for (int i = 0; i < n; ++i) {
    auto w = worker("w" + std::to_string(i), uniform(g, 0, 4));
    if (coin(g, 35)) {
      for (device d : all_valid(w.device_count))
        if (coin(g, 60)) w.devices.push_back(d);
      std::shuffle(w.devices.begin(), w.devices.end(), g);
    }
    out.workers.push_back(std::move(w));
  }
  std::shuffle(out.workers.begin(), out.workers.end(), g);
  for (auto& w : out.workers) {
    for (const auto& peer : out.workers) {
      if (!coin(g, 50)) continue;
      auto sources = usable(w);
      auto targets = usable(peer);
      std::shuffle(sources.begin(), sources.end(), g);
      std::shuffle(targets.begin(), targets.end(), g);
      const int k = uniform(g, 0, static_cast<int>(std::min(sources.size(), targets.size())));
      device_map m;
      for (int e = 0; e < k; ++e) REQUIRE(m.set(sources[e], targets[e]));
      w.maps[peer.name] = std::move(m);
    }
    if (allow_unknown && coin(g, 20)) {
      // A worker that has not joined yet: any target devices at all.
      auto sources = usable(w);
      device_map m;
      int next = uniform(g, 0, 50);
      bool cpu_taken = false;
      for (device s : sources) {
        if (!coin(g, 50)) continue;
        const bool to_cpu = !cpu_taken && coin(g, 20);
        cpu_taken = cpu_taken || to_cpu;
        REQUIRE(m.set(s, to_cpu ? cpu() : cuda(next++)));
      }
      w.maps["joins-later-" + std::to_string(uniform(g, 0, 3))] = std::move(m);
      out.has_unknown_targets = true;
    }
  }
  return out;
}

std::string describe(const std::vector<worker_device_info>& all) {
  std::ostringstream os;
  for (const auto& w : all) os << "\n  " << w;
  return std::move(os).str();
}

const worker_device_info* find(const std::vector<worker_device_info>& all, const std::string& n) {
  for (const auto& w : all)
    if (w.name == n) return &w;
  return nullptr;
}

void check_properties(const group& grp) {
  const auto& all = grp.workers;
  if (!grp.has_unknown_targets) CHECK(validate_device_maps(all, group_kind::static_group));
  CHECK(validate_device_maps(all, group_kind::dynamic_group));

  // reverse[B][A] is A's map for B, inverted; reversing the reversed group gives the
  // original maps of every known target back.
  std::vector<worker_device_info> flipped;
  for (const auto& b : all) {
    auto reverse = reverse_device_maps(b.name, all);
    for (const auto& a : all) {
      auto forward = a.maps.find(b.name);
      auto back = reverse.find(a.name);
      REQUIRE((forward == a.maps.end()) == (back == reverse.end()));
      if (forward != a.maps.end()) CHECK(back->second == invert(forward->second));
    }
    flipped.push_back(worker(b.name, b.device_count, reverse, b.devices));
  }
  CHECK(validate_device_maps(flipped, group_kind::static_group));
  for (const auto& a : all) {
    device_maps known;
    for (const auto& [target, m] : a.maps)
      if (find(all, target)) known.emplace(target, m);
    CHECK(reverse_device_maps(a.name, flipped) == known);
  }

  // Device lists.
  for (const auto& me : all) {
    auto reverse = reverse_device_maps(me.name, all);
    auto list = build_device_list(me, reverse);
    CHECK(std::is_sorted(list.begin(), list.end()));
    CHECK(std::adjacent_find(list.begin(), list.end()) == list.end());
    if (!me.devices.empty()) {
      CHECK(std::set<device>(list.begin(), list.end()) ==
            std::set<device>(me.devices.begin(), me.devices.end()));
    } else {
      std::set<device> expect;
      for (const auto& [t, m] : me.maps)
        for (const auto& [s, d] : m)
          if (s.is_cuda()) expect.insert(s);
      for (const auto& [t, m] : reverse)
        for (const auto& [s, d] : m)
          if (s.is_cuda()) expect.insert(s);
      CHECK(std::vector<device>(expect.begin(), expect.end()) == list);
      for (device d : list) CHECK(is_valid_device(d, me.device_count));
    }
    auto setup = resolve_device_setup(me.name, all, group_kind::dynamic_group);
    REQUIRE(setup);
    CHECK(setup->reverse_maps == reverse);
    CHECK(setup->devices == list);

    auto decoded = decode_worker_device_info(encode(me));
    REQUIRE(decoded);
    CHECK(*decoded == me);
  }
}

/// The violations injected into valid groups, and a phrase each one's message holds.
enum class violation {
  duplicate_name,
  duplicate_listed_device,
  listed_device_out_of_range,
  unknown_target,
  shared_target_device,
  source_not_listed,
  source_out_of_range,
  target_not_listed,
  target_out_of_range,
  count_
};

const char* phrase(violation v) {
  switch (v) {
    case violation::duplicate_name:
      return "appears twice in the group";
    case violation::duplicate_listed_device:
      return "twice in its device list";
    case violation::listed_device_out_of_range:
      return "from the list or run";
    case violation::unknown_target:
      return "no worker of that name";
    case violation::shared_target_device:
      return "may receive from one device";
    case violation::source_not_listed:
      return "to that list or drop the entry";
    case violation::source_out_of_range:
      return "use a source device that exists";
    case violation::target_not_listed:
      return "lists or add";
    case violation::target_out_of_range:
      return "map to a device that exists";
    case violation::count_:
      break;
  }
  return "";
}

/// Breaks one rule in a valid static group; returns the kind checked.
group_kind inject(rng& g, std::vector<worker_device_info>& all, violation v) {
  auto& w = all[static_cast<std::size_t>(uniform(g, 0, static_cast<int>(all.size()) - 1))];
  auto& peer = all[static_cast<std::size_t>(uniform(g, 0, static_cast<int>(all.size()) - 1))];
  const int beyond = uniform(g, 0, 3);
  switch (v) {
    case violation::duplicate_name:
      all.push_back(worker(all[0].name, 1));
      break;
    case violation::duplicate_listed_device:
      if (w.devices.empty()) w.devices = all_valid(w.device_count);
      w.devices.push_back(w.devices[static_cast<std::size_t>(
          uniform(g, 0, static_cast<int>(w.devices.size()) - 1))]);
      break;
    case violation::listed_device_out_of_range:
      w.devices.push_back(cuda(w.device_count + beyond));
      break;
    case violation::unknown_target:
      w.maps["never-joined"] = dmap({{usable(w).front(), cuda(99)}});
      return group_kind::static_group;
    case violation::shared_target_device: {
      // Two distinct usable sources onto one usable target of the peer.
      auto sources = usable(w);
      if (sources.size() < 2) {
        w.device_count = std::max(w.device_count, 1);
        w.devices.clear();
        sources = all_valid(w.device_count);
      }
      device t = usable(peer).front();
      w.maps[peer.name] = dmap({{sources[0], t}});
      REQUIRE(w.maps[peer.name].set(sources[1], t));
      break;
    }
    case violation::source_not_listed:
      if (w.devices.empty()) w.devices = all_valid(w.device_count);
      w.maps[peer.name] = dmap({{cuda(w.device_count + beyond), usable(peer).front()}});
      break;
    case violation::source_out_of_range:
      w.devices.clear();
      w.maps[peer.name] = dmap({{cuda(w.device_count + beyond), usable(peer).front()}});
      break;
    case violation::target_not_listed:
      if (peer.devices.empty()) peer.devices = all_valid(peer.device_count);
      w.maps[peer.name] = dmap({{usable(w).front(), cuda(peer.device_count + beyond)}});
      break;
    case violation::target_out_of_range:
      peer.devices.clear();
      w.maps[peer.name] = dmap({{usable(w).front(), cuda(peer.device_count + beyond)}});
      break;
    case violation::count_:
      break;
  }
  return coin(g, 50) ? group_kind::static_group : group_kind::dynamic_group;
}

}  // namespace

TEST_CASE("generated valid groups pass validation and keep the reverse and list properties") {
  for (int i = 0; i < group_count; ++i) {
    rng g(base_seed + static_cast<std::uint32_t>(i));
    const auto grp = make_valid_group(g, /*allow_unknown=*/i % 2 == 1);
    INFO("base seed ", base_seed, ", group ", i, ":", describe(grp.workers));
    check_properties(grp);
  }
}

TEST_CASE("generated groups with one injected violation are refused") {
  const int kinds = static_cast<int>(violation::count_);
  for (int i = 0; i < group_count; ++i) {
    rng g(base_seed ^ (0x9e3779b9u + static_cast<std::uint32_t>(i)));
    auto all = make_valid_group(g, /*allow_unknown=*/false).workers;
    const auto v = static_cast<violation>(i % kinds);
    const auto kind = inject(g, all, v);
    const std::string kind_name = kind == group_kind::static_group ? "static" : "dynamic";
    INFO("base seed ", base_seed, ", group ", i, ", violation ", static_cast<int>(v), " in a ",
         kind_name, " group:", describe(all));
    auto r = validate_device_maps(all, kind);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(r.error().message().find(phrase(v)) != std::string::npos);
    if (v == violation::unknown_target) CHECK(validate_device_maps(all, group_kind::dynamic_group));
  }
}
