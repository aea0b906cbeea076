#include <troupe/collectives/comm_plan.hpp>

#include <algorithm>

#include <troupe/collectives/process_group.hpp>

namespace troupe::collectives {

namespace {

// Whether members[i].rank == i throughout.
bool dense(const membership::epoch& e) {
  for (std::size_t i = 0; i < e.members.size(); ++i)
    if (e.members[i].rank != static_cast<int>(i)) return false;
  return true;
}

std::string names_or_dash(const std::vector<std::string>& v) {
  if (v.empty()) return "-";
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::string_view to_string(comm_action a) noexcept {
  switch (a) {
    case comm_action::keep:
      return "keep";
    case comm_action::shrink:
      return "shrink";
    case comm_action::recreate:
      return "recreate";
  }
  return "recreate";
}

bool shrink_supported(int version_code) noexcept { return version_code >= nccl_shrink_min_version; }

std::string format_nccl_version(int v) {
  // NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
  if (v < 10000) return strcat(v / 1000, ".", v % 1000 / 100, ".", v % 100);
  return strcat(v / 10000, ".", v % 10000 / 100, ".", v % 100);
}

expected<comm_plan> plan_comm_change(const membership::epoch& before,
                                     const membership::epoch& after, const comm_state& old,
                                     std::string_view new_group) {
  if (after.number <= before.number)
    return make_error(errc::invalid_argument, "planning a communicator change from epoch ",
                      before.number, " to epoch ", after.number,
                      ": the new epoch must be newer than the old one");
  if (!dense(before) || !dense(after))
    return make_error(errc::invalid_argument, "planning a communicator change from epoch ",
                      before.number, " to epoch ", after.number,
                      ": an epoch's ranks must be the members' positions (0..n-1)");
  comm_plan p;
  p.from_epoch = before.number;
  p.to_epoch = after.number;
  p.abort_first = old.pending_work || old.in_error;
  // Survivors, in old rank order, and where they sit now.
  std::vector<int> survivors_new;
  for (const auto& m : before.members) {
    const auto* now = after.find(m.name);
    if (now != nullptr && now->incarnation == m.incarnation) {
      p.new_rank.push_back(now->rank);
      survivors_new.push_back(now->rank);
    } else {
      p.new_rank.push_back(-1);
      p.excluded.push_back(m.rank);
      p.left.push_back(membership::describe(m));
    }
  }
  for (const auto& m : after.members)
    if (!before.contains(m.name, m.incarnation)) p.came.push_back(membership::describe(m));

  // ncclCommShrink numbers the survivors 0..k-1 in their old order.
  bool order_kept = true;
  for (std::size_t i = 0; i < survivors_new.size(); ++i)
    if (survivors_new[i] != static_cast<int>(i)) order_kept = false;

  auto recreate = [&](std::string why) {
    p.action = comm_action::recreate;
    p.unique_id_key = strcat(new_group, "/nccl/unique_id");
    p.reason = std::move(why);
    return p;
  };
  if (!p.came.empty())
    return recreate(
        strcat(p.came.size(), " member(s) came: a new communicator from a fresh unique id"));
  if (!order_kept)
    return recreate("the survivors' ranks do not follow their old order: a new communicator");
  if (after.members.empty()) return recreate("the new epoch is empty");
  if (!old.live)
    return recreate("the old communicator was aborted or destroyed: a new communicator");
  if (p.excluded.empty()) {
    if (p.abort_first)  // nobody to exclude: a shrink would change nothing
      return recreate(
          "the same members after a fault: the old communicator is aborted and a "
          "new one made");
    p.action = comm_action::keep;
    p.reason = "the same members in the same order: the communicator is kept";
    return p;
  }
  if (!shrink_supported(old.library_version))
    return recreate(strcat("ncclCommShrink needs NCCL 2.27 or newer and this process has ",
                           old.library_version > 0 ? format_nccl_version(old.library_version)
                                                   : std::string("an unknown version"),
                           ": a new communicator instead"));
  p.action = comm_action::shrink;
  p.reason = strcat("only departures: shrink excluding old ranks ", format_ranks(p.excluded),
                    p.abort_first ? ", aborting the old operations first" : "");
  return p;
}

std::string describe(const comm_plan& p) {
  return strcat("epoch ", p.from_epoch, " -> ", p.to_epoch, ": ", to_string(p.action), " (",
                p.reason, "); left: ", names_or_dash(p.left), "; came: ", names_or_dash(p.came));
}

}  // namespace troupe::collectives
