// A user's program built against an installed troupe.
#include <troupe/core/device.hpp>
#include <troupe/core/future.hpp>

#include <iostream>

int main() {
  auto d = troupe::device::parse("cuda:1");
  if (!d) return 1;
  auto f =
      troupe::make_ready_future(d->to_string()).then([](std::string s) { return "parsed " + s; });
  auto r = f.get(std::chrono::seconds(1));
  if (!r) return 1;
  std::cout << *r << "\n";
  return 0;
}
