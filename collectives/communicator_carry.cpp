#include <troupe/collectives/communicator_carry.hpp>

#include <troupe/core/log.hpp>

namespace troupe::collectives {

namespace {

std::string carry_key(const std::string& commit_prefix, const carry_offer& o) {
  return strcat(commit_prefix, "carry-from-", o.from->number);
}

}  // namespace

carry_offer make_carry_offer(std::shared_ptr<process_group> prev,
                             std::shared_ptr<const membership::epoch> from,
                             const membership::epoch& to, const std::string& group_name) {
  carry_offer o;
  o.prev = std::move(prev);
  o.from = std::move(from);
  if (!o.prev || !o.from || o.from->number >= to.number) return o;
  auto state = o.prev->rebuild_state();
  if (!state) return o;  // a backend without native rebuild: always built anew
  auto plan = plan_comm_change(*o.from, to, *state, group_name);
  if (!plan) {
    TROUPE_LOG(log_level::warn, "collectives", "no communicator plan for ", describe(*o.prev), ": ",
               plan.error().message());
    return o;
  }
  o.offers = plan->action != comm_action::recreate;
  o.plan = std::move(*plan);
  return o;
}

expected<void> publish_carry(store& s, const std::string& commit_prefix, const carry_offer& o,
                             duration timeout) {
  if (!o.offers) return ok();
  const auto key = carry_key(commit_prefix, o);
  TROUPE_TRY(s.add(key, 1, timeout));
  if (o.plan->abort_first) TROUPE_TRY(s.add(key + "-abort", 1, timeout));
  return ok();
}

expected<carry_agreement> agree_carry(store& s, const std::string& commit_prefix,
                                      const membership::epoch& to, const carry_offer& o,
                                      duration timeout) {
  carry_agreement a;
  const auto key = carry_key(commit_prefix, o);
  auto n = s.add(key, 0, timeout);
  if (!n) return std::move(n).error();
  auto aborting = s.add(key + "-abort", 0, timeout);
  if (!aborting) return std::move(aborting).error();
  a.offered = *n;
  a.all = o.offers && *n == static_cast<std::int64_t>(to.size());
  a.abort_first = *aborting > 0;
  return a;
}

}  // namespace troupe::collectives
