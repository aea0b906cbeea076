#include <troupe/rpc/detail/member_view.hpp>

#include <algorithm>
#include <mutex>

#include <troupe/core/strcat.hpp>

namespace troupe::rpc::detail {

namespace {

std::vector<worker_device_info> devices_of(const std::map<std::string, member>& all) {
  std::vector<worker_device_info> infos;
  infos.reserve(all.size());
  for (const auto& [n, m] : all) infos.push_back(m.devices);
  return infos;
}

}  // namespace

expected<void> member_view::replace(std::map<std::string, member> all) {
  auto s = resolve_device_setup(self_, devices_of(all), kind_);
  if (!s) return std::move(s).error();
  std::unique_lock lk(mu_);
  members_ = std::move(all);
  setup_ = std::move(*s);
  return ok();
}

std::optional<member> member_view::remove(const std::string& name, std::string_view tag) {
  if (name == self_) return std::nullopt;
  std::unique_lock lk(mu_);
  auto it = members_.find(name);
  if (it == members_.end() || (!tag.empty() && it->second.tag != tag)) return std::nullopt;
  member gone = std::move(it->second);
  members_.erase(it);
  if (auto s = resolve_device_setup(self_, devices_of(members_), kind_)) setup_ = std::move(*s);
  return gone;
}

std::optional<member> member_view::get(const std::string& name) const {
  std::shared_lock lk(mu_);
  auto it = members_.find(name);
  if (it == members_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, member> member_view::all() const {
  std::shared_lock lk(mu_);
  return members_;
}

std::vector<member> member_view::others() const {
  std::vector<member> out;
  std::shared_lock lk(mu_);
  for (const auto& [n, m] : members_)
    if (n != self_) out.push_back(m);
  return out;
}

std::vector<worker_info> member_view::infos() const {
  std::vector<worker_info> out;
  {
    std::shared_lock lk(mu_);
    for (const auto& [n, m] : members_) out.push_back(m.info);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

expected<worker_info> member_view::find(const worker_ref& w) const {
  std::shared_lock lk(mu_);
  if (!w.name.empty()) {
    auto it = members_.find(w.name);
    if (it != members_.end()) return it->second.info;
  } else {
    for (const auto& [n, m] : members_)
      if (m.info.id == w.id) return m.info;
  }
  std::string names;
  for (const auto& [n, m] : members_) names += (names.empty() ? "" : ", ") + n;
  return make_error(errc::not_found, "no worker ",
                    w.name.empty() ? strcat("with id ", w.id) : strcat("named '", w.name, "'"),
                    " in this group (workers: ", names.empty() ? "none" : names, ")",
                    kind_ == group_kind::dynamic_group ? "; it may have left or died" : "");
}

device_setup member_view::setup() const {
  std::shared_lock lk(mu_);
  return setup_;
}

std::optional<device_map> member_view::reverse_map_for(const std::string& caller) const {
  std::shared_lock lk(mu_);
  if (auto it = setup_.reverse_maps.find(caller); it != setup_.reverse_maps.end())
    return it->second;
  return std::nullopt;
}

bool member_view::same_host(const std::string& peer) const {
  std::shared_lock lk(mu_);
  auto them = members_.find(peer);
  auto me = members_.find(self_);
  if (them == members_.end() || me == members_.end() || them->second.host_key.empty()) return false;
  return them->second.host_key == me->second.host_key;
}

}  // namespace troupe::rpc::detail
