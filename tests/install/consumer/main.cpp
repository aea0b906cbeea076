// A user's program built against an installed troupe: the umbrella header, and single
// module headers beside it.
#include <troupe/core/device.hpp>
#include <troupe/core/future.hpp>
#include <troupe/devicemap/derive.hpp>
#include <troupe/devicemap/validate.hpp>
#include <troupe/training/ddp.hpp>
#include <troupe/training/strategy_registry.hpp>
#include <troupe/troupe.hpp>

#include <iostream>

int main() {
  auto d = troupe::device::parse("cuda:1");
  if (!d) return 1;
  auto f =
      troupe::make_ready_future(d->to_string()).then([](std::string s) { return "parsed " + s; });
  auto r = f.get(std::chrono::seconds(1));
  if (!r) return 1;
  std::cout << *r << "\n";

  troupe::worker_device_info a{"a", 2, {}, {}}, b{"b", 2, {}, {}};
  if (!a.maps["b"].set(*troupe::device::cuda(0), *d)) return 1;
  std::vector<troupe::worker_device_info> group{a, b};
  auto setup = troupe::resolve_device_setup("b", group, troupe::group_kind::static_group);
  if (!setup) {
    std::cerr << setup.error() << "\n";
    return 1;
  }
  std::cout << "reverse maps of b: " << troupe::to_string(setup->reverse_maps) << "\n";

  // The umbrella's modules compile and link here (nothing is started).
  troupe::init_options io;
  io.rpc = false;
  troupe::rpc::rpc_backend_options ro;
  ro.cuda_ipc = true;
  troupe::collectives::allreduce_options ao;
  std::cout << "defaults: rpc timeout " << troupe::format_duration(ro.rpc_timeout)
            << ", allreduce op " << troupe::collectives::to_string(ao.op) << "\n";
  (void)io;

  auto strategy = troupe::training::strategy_registry::with_builtins().find("ddp_spawn");
  if (!strategy) return 1;
  std::cout << strategy->name << " starts workers with "
            << troupe::training::to_string(strategy->start) << "\n";
  return 0;
}
