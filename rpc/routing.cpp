#include <troupe/rpc/routing.hpp>

#include <troupe/rpc/detail/ipc_record.hpp>
#include <troupe/rpc/device_helper.hpp>

namespace troupe::rpc {

expected<device> route_device(device source, std::string_view self, std::string_view peer,
                              const device_map* map, route_kind kind) {
  if (map) {
    if (auto t = map->find(source)) return *t;
  }
  if (source.is_cpu()) return device::cpu();
  if (kind == route_kind::request)
    return make_error(errc::invalid_argument, "worker '", self, "' cannot send a tensor on ",
                      source, " to worker '", peer, "': its device maps have no entry for ", source,
                      (map ? strcat(" in the map for '", peer, "' ", to_string(*map))
                           : strcat(" (no map for '", peer, "' at all)")),
                      "; set options.device_maps[\"", peer, "\"] to map ", source,
                      " to a device of '", peer, "' (e.g. ", source,
                      " -> cuda:0), or move the "
                      "tensor to the CPU first")
        .with_worker(std::string(self));
  return make_error(errc::invalid_argument, "worker '", self, "' cannot return a tensor on ",
                    source, " to worker '", peer, "': no device of '", peer, "' maps to ", source,
                    " (reverse map ", (map ? to_string(*map) : std::string("{}")),
                    "); add an entry ", "targeting ", source, " to device_maps[\"", self,
                    "\"] on '", peer, "', or return the tensor on the CPU")
      .with_worker(std::string(self));
}

expected<void> prepare_outgoing(std::vector<tensor>& ts, std::string_view self,
                                std::string_view peer, const device_map* map, route_kind kind,
                                ipc_lender* lender) {
  for (auto& t : ts) {
    auto target = route_device(t.dev(), self, peer, map, kind);
    if (!target) return std::move(target).error();
    if (lender && t.dev().is_cuda() && target->is_cuda() && t.is_contiguous() && t.nbytes() > 0) {
      const auto id = lender->next_loan_id();
      if (auto lent = lend_through_ipc(t, *target, id)) {
        lender->file_loan(id, std::move(lent->keep));
        t = std::move(lent->record);
        continue;
      }
      // Memory IPC cannot share (a stream-ordered pool, managed memory): staged below.
    }
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

expected<void> place_incoming(std::vector<tensor>& ts, std::string_view self, int device_count,
                              const std::function<void(std::uint64_t)>& release) {
  // Every IPC record not yet read is released on the way out, whatever happens.
  std::size_t next = 0;
  struct release_rest {
    std::vector<tensor>& ts;
    std::size_t& next;
    const std::function<void(std::uint64_t)>& release;
    ~release_rest() {
      for (std::size_t i = next; i < ts.size(); ++i)
        if (detail::is_ipc_record(ts[i]) && release)
          if (auto id = ipc_record_loan_id(ts[i])) release(id);
    }
  } guard{ts, next, release};
  for (; next < ts.size(); ++next) {
    auto& t = ts[next];
    if (!t.dev().is_cuda()) continue;
    if (t.dev().index() >= device_count)
      return make_error(errc::invalid_argument, "a tensor for ", t.dev(), " arrived at worker '",
                        self, "', which has ", device_count,
                        " CUDA devices; fix the sender's device map for '", self, "'")
          .with_worker(std::string(self));
    if (detail::is_ipc_record(t)) {
      const auto id = ipc_record_loan_id(t);
      auto copied = receive_through_ipc(t);
      if (id && release) release(id);
      if (!copied) {
        ++next;
        return std::move(copied).error().with_worker(std::string(self));
      }
      t = std::move(*copied);
      continue;
    }
    auto on_device = upload_to_device(t.with_device(device::cpu()), t.dev());
    if (!on_device) return std::move(on_device).error();
    t = std::move(*on_device);
  }
  return ok();
}

}  // namespace troupe::rpc
