#include <troupe/collectives/roll_call.hpp>

#include <algorithm>

namespace troupe::collectives {

duration roll_call_budget(duration timeout) {
  return std::clamp<duration>(timeout / 5, duration(100), duration(1000));
}

std::optional<std::vector<int>> roll_call(store& s, const group_spec& spec, std::uint64_t seq,
                                          duration budget) {
  // One key per member: a group fails once (its error is sticky), so a member's
  // announcement means "alive and failed too", whichever operation it was in; members
  // can be one operation apart when the failure strikes.
  auto dl = deadline::after(budget);
  const std::string mine = std::to_string(seq);
  if (!s.set(strcat("rollcall/", spec.rank), std::as_bytes(std::span(mine.data(), mine.size())),
             budget))
    return std::nullopt;
  std::vector<std::string> keys;
  for (int r = 0; r < spec.size; ++r) keys.push_back(strcat("rollcall/", r));
  if (s.wait(keys, dl.remaining())) return std::vector<int>{};
  std::vector<int> missing;
  for (int r = 0; r < spec.size; ++r) {
    const auto& k = keys[static_cast<std::size_t>(r)];
    auto there = s.check(std::span(&k, 1), duration(1000));
    if (!there) return std::nullopt;
    if (!*there)
      missing.push_back(r < static_cast<int>(spec.global_ranks.size())
                            ? spec.global_ranks[static_cast<std::size_t>(r)]
                            : r);
  }
  return missing;
}

std::string describe_missing(const std::optional<std::vector<int>>& missing) {
  if (!missing) return "the ranks that did not arrive are unknown (the store did not answer)";
  if (missing->empty()) return "every rank reached it";
  return strcat(missing->size() == 1 ? "rank " : "ranks ", format_ranks(*missing),
                " did not arrive");
}

}  // namespace troupe::collectives
