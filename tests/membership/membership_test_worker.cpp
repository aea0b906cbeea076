// A member of a job's membership, for the multi-process tests.
//
//   membership_test_worker <store url> <scope> <name> <timeout ms> <interval ms>
//
// Joins under <scope>/membership (timeout 0: TROUPE_HEARTBEAT_TIMEOUT and
// TROUPE_HEARTBEAT_INTERVAL), then records every epoch it sees in the store: `seen/<name>/<n>`
// and `latest/<name>` hold the epoch record. It leaves and exits 0 once `stop` is set; if it
// finds itself left out of an epoch it writes its error to `evicted/<name>` and exits 3.
// Exits 2 on any other failure; it never runs longer than two minutes.
#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>

#include <troupe/membership/service.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>

using namespace std::chrono_literals;
namespace m = troupe::membership;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: membership_test_worker <url> <scope> <name> <timeout ms> <interval ms>\n";
    return 2;
  }
  const std::string url = argv[1], scope = argv[2], name = argv[3];
  troupe::store_options so;
  so.connect_timeout = 10s;
  so.timeout = 20s;
  auto opened = troupe::connect_store(url, so);
  if (!opened) {
    std::cerr << name << ": " << opened.error() << "\n";
    return 2;
  }
  std::shared_ptr<troupe::store> base = std::move(*opened);
  auto records = std::make_shared<troupe::prefix_store>(base, scope);
  auto scoped = std::make_shared<troupe::prefix_store>(base, scope + "/membership");

  m::service_options o;
  o.name = name;
  o.heartbeat_timeout = troupe::duration(std::stoll(argv[4]));
  o.heartbeat_interval = troupe::duration(std::stoll(argv[5]));
  o.op_timeout = 5s;
  // Called from the main thread once and from the service's watcher for every later epoch;
  // the two can race, so an older epoch never overwrites a newer one in `latest/<name>`.
  auto recorded = std::make_shared<std::pair<std::mutex, std::uint64_t>>();
  auto record = [records, name, recorded](const m::epoch& e) {
    std::lock_guard lk(recorded->first);
    if (e.number <= recorded->second) return;
    recorded->second = e.number;
    const auto text = m::encode(e);
    (void)records->set("seen/" + name + "/" + std::to_string(e.number), text);
    (void)records->set("latest/" + name, text);
  };
  auto svc = m::service::join(scoped, o, 20s);
  if (!svc) {
    std::cerr << name << ": " << svc.error() << "\n";
    return 2;
  }
  (*svc)->on_epoch([record](const m::epoch&, const m::epoch& after) { record(after); });
  record((*svc)->current());

  const auto until = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < until) {
    if (auto h = (*svc)->health(); !h) {
      std::cerr << name << ": " << h.error() << "\n";
      (void)records->set("evicted/" + name, h.error().to_string());
      return 3;
    }
    auto stop = records->get("stop", 100ms);
    if (stop) {
      auto left = (*svc)->shutdown(10s);
      if (!left) {
        std::cerr << name << ": leaving: " << left.error() << "\n";
        return 2;
      }
      return 0;
    }
    if (stop.error().code() != troupe::errc::timeout) {
      std::cerr << name << ": " << stop.error() << "\n";
      return 2;
    }
  }
  std::cerr << name << ": nobody set 'stop' in two minutes\n";
  return 2;
}
