// worker_ref: how a caller names a worker: by name or by id.
#pragma once

#include <string>
#include <string_view>

#include <troupe/core/worker_info.hpp>

namespace troupe::rpc {

struct worker_ref {
  worker_ref(std::string_view n) : name(n) {}
  worker_ref(const char* n) : name(n) {}
  worker_ref(const std::string& n) : name(n) {}
  worker_ref(const worker_info& w) : name(w.name), id(w.id) {}
  /// By id (a rank in a static group).
  static worker_ref by_id(std::int32_t i) {
    worker_ref r{std::string_view{}};
    r.id = i;
    return r;
  }
  std::string name;
  std::int32_t id = -1;
};

}  // namespace troupe::rpc
