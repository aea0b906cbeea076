#include <troupe/membership/settings.hpp>

namespace troupe::settings {

setting_list membership_settings() {
  static constexpr const setting* list[] = {&heartbeat_timeout, &heartbeat_interval};
  return list;
}

}  // namespace troupe::settings
