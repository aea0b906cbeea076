// This worker's view of its group: who is in it, where each listens, its devices, and the
// device setup (reverse maps, device list) resolved from them. One of agent_core's parts
// (docs/architecture.md): it owns its state under one reader-writer lock, does no I/O,
// and hands out copies, so that no caller holds its lock while it sends or waits.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/devicemap/derive.hpp>
#include <troupe/devicemap/validate.hpp>
#include <troupe/rpc/worker_ref.hpp>

namespace troupe::rpc::detail {

/// What the group knows about one worker.
struct member {
  worker_info info;
  std::string host;
  std::uint16_t port = 0;
  worker_device_info devices;
  /// The worker's host (core/net_address.hpp host_key() and host name), so that a loopback
  /// address in a group across hosts is refused by name instead of refused by the kernel.
  std::string host_key;
  std::string host_name;
  /// rpc_backend_options::membership_tag of the worker (empty when the agent decides).
  std::string tag;
};
bytes encode_member(const member& m);
expected<member> decode_member(std::span<const std::byte> data);

class member_view {
 public:
  /// The view of worker `self` in a static or dynamic group (their device setups differ).
  member_view(std::string self, group_kind kind) : self_(std::move(self)), kind_(kind) {}

  /// Replaces every member. The device setup is resolved first; when it cannot be,
  /// nothing changes and the error says why.
  expected<void> replace(std::map<std::string, member> all);

  /// Takes `name` out (never this worker), if it is a member whose tag is `tag` (empty:
  /// any), and recomputes the device setup from those left (a setup they cannot resolve
  /// keeps the previous one). Returns the member taken out.
  std::optional<member> remove(const std::string& name, std::string_view tag = {});

  /// A copy of member `name`, if it is one.
  std::optional<member> get(const std::string& name) const;
  /// A copy of every member, by name.
  std::map<std::string, member> all() const;
  /// Every member but this worker.
  std::vector<member> others() const;
  /// The members' infos, ordered by id.
  std::vector<worker_info> infos() const;
  /// A member by name or id; errc::not_found lists the members (`dynamic`: says it may
  /// have left or died).
  expected<worker_info> find(const worker_ref& w) const;

  /// The device setup resolved from the current members.
  device_setup setup() const;
  /// The reverse device map for results going back to `caller`; nullopt when none.
  std::optional<device_map> reverse_map_for(const std::string& caller) const;
  /// Whether `peer` runs on this worker's host: both are members and their host keys are
  /// known and equal.
  bool same_host(const std::string& peer) const;

 private:
  const std::string self_;
  const group_kind kind_;
  mutable std::shared_mutex mu_;
  std::map<std::string, member> members_;
  device_setup setup_;
};

}  // namespace troupe::rpc::detail
