#include "rpc/routing.hpp"

#include "rpc/device_helper.hpp"

namespace troupe::rpc {

expected<device> route_device(device source, std::string_view self, std::string_view peer,
                              const device_map* map, route_kind kind) {
  if (map) {
    if (auto t = map->find(source)) return *t;
  }
  if (source.is_cpu()) return device::cpu();
  if (kind == route_kind::request)
    return make_error(errc::invalid_argument, "worker '", self, "' cannot send a tensor on ",
                      source, " to worker '", peer, "': its device maps have no entry for ",
                      source, (map ? strcat(" in the map for '", peer, "' ", to_string(*map))
                                   : strcat(" (no map for '", peer, "' at all)")),
                      "; set options.device_maps[\"", peer, "\"] to map ", source,
                      " to a device of '", peer, "' (e.g. ", source, " -> cuda:0), or move the "
                      "tensor to the CPU first")
        .with_worker(std::string(self));
  return make_error(errc::invalid_argument, "worker '", self, "' cannot return a tensor on ",
                    source, " to worker '", peer, "': no device of '", peer, "' maps to ", source,
                    " (reverse map ", (map ? to_string(*map) : std::string("{}")), "); add an entry ",
                    "targeting ", source, " to device_maps[\"", self, "\"] on '", peer,
                    "', or return the tensor on the CPU")
      .with_worker(std::string(self));
}

expected<void> prepare_outgoing(std::vector<tensor>& ts, std::string_view self,
                                std::string_view peer, const device_map* map, route_kind kind) {
  for (auto& t : ts) {
    auto target = route_device(t.dev(), self, peer, map, kind);
    if (!target) return std::move(target).error();
    if (t.dev().is_cuda()) {
      auto host = stage_to_host(t);
      if (!host) return std::move(host).error();
      t = std::move(*host);
    } else if (!t.is_contiguous()) {
      t = t.contiguous();
    }
    t = t.with_device(*target);
  }
  return ok();
}

bool needs_placement(const std::vector<tensor>& ts) noexcept {
  for (const auto& t : ts)
    if (t.dev().is_cuda()) return true;
  return false;
}

expected<void> place_incoming(std::vector<tensor>& ts, std::string_view self, int device_count) {
  for (auto& t : ts) {
    if (!t.dev().is_cuda()) continue;
    if (t.dev().index() >= device_count)
      return make_error(errc::invalid_argument, "a tensor for ", t.dev(), " arrived at worker '",
                        self, "', which has ", device_count,
                        " CUDA devices; fix the sender's device map for '", self, "'")
          .with_worker(std::string(self));
    auto on_device = upload_to_device(t.with_device(device::cpu()), t.dev());
    if (!on_device) return std::move(on_device).error();
    t = std::move(*on_device);
  }
  return ok();
}

}  // namespace troupe::rpc
