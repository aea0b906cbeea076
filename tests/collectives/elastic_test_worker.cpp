// A member of an elastic job for the multi-process tests of collectives/elastic_group.
//
//   elastic_test_worker <store url> <scope> <name> <heartbeat timeout ms> <interval ms>
//
// Joins the membership under <scope>/membership, then runs allreduces on the group of the
// newest epoch until `stop` is set under <scope>, checking every result. Op k of a group
// of n members sums (rank + 1) * (j + 1) + k over the members in element j, so a wrong
// world size, a rank mix-up or two members on different ops all show as a wrong value.
// Records, under <scope> (times are CLOCK_MONOTONIC nanoseconds, shared by the processes
// of one machine):
//   ok/<name>               "<epoch> <size> <ops in this epoch>" after each good op
//   resumed/<name>/<epoch>  the time of the first good op of each epoch after the first
//   failed/<name>/<k>       "<time> <error code>\n<message>" for the k-th failed op (1-based)
// Exits 0 once `stop` is set (leaving the membership), 3 when it finds itself left out of
// the job (its error in evicted/<name>), 4 on a wrong value (bad/<name> says which), 2 on
// any other failure. It never runs longer than a minute.
#include <time.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/membership/service.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>

using namespace std::chrono_literals;
namespace c = troupe::collectives;
namespace m = troupe::membership;

namespace {

std::int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

constexpr std::size_t elements = 1024;
// Far above the heartbeat timeout: an op that fails near the heartbeat timeout was ended by
// the epoch change, not by its own timeout.
constexpr auto op_timeout = 60s;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: elastic_test_worker <url> <scope> <name> <timeout ms> <interval ms>\n";
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
  auto put = [&](const std::string& key, const std::string& value) {
    (void)records->set(key, std::string_view(value));
  };

  m::service_options mo;
  mo.name = name;
  mo.heartbeat_timeout = troupe::duration(std::stoll(argv[4]));
  mo.heartbeat_interval = troupe::duration(std::stoll(argv[5]));
  mo.op_timeout = 5s;
  auto joined = m::service::join(scoped, mo, 20s);
  if (!joined) {
    std::cerr << name << ": joining: " << joined.error() << "\n";
    return 2;
  }
  std::shared_ptr<m::service> svc = std::move(*joined);
  c::elastic_options eo;
  eo.name = scope + "/elastic";
  eo.build_timeout = 20s;
  auto made = c::elastic_group::make(svc, base, eo);
  if (!made) {
    std::cerr << name << ": " << made.error() << "\n";
    return 2;
  }
  auto& eg = **made;

  std::vector<std::int64_t> data(elements);
  int failures = 0;
  bool first_epoch = true;
  const std::string stop_key[] = {"stop"};
  const auto until = std::chrono::steady_clock::now() + 60s;
  auto evicted = [&](const troupe::error& e) {
    std::cerr << name << ": " << e << "\n";
    put("evicted/" + name, e.to_string());
    return 3;
  };
  while (std::chrono::steady_clock::now() < until) {
    auto v = eg.rebuild(20s);
    if (!v) {
      if (v.error().code() == troupe::errc::membership_changed) return evicted(v.error());
      std::cerr << name << ": rebuilding: " << v.error() << "\n";
      return 2;
    }
    auto& g = *v->group;
    const std::int64_t n = g.size();
    const std::int64_t sum_ranks = n * (n + 1) / 2;  // sum of (rank + 1)
    bool resumed_recorded = first_epoch;
    first_epoch = false;
    for (std::int64_t k = 0;; ++k) {
      auto stop = records->check(stop_key, 5s);
      if (stop && *stop) {
        eg.shutdown(5s);
        auto left = svc->shutdown(10s);
        if (!left) {
          std::cerr << name << ": leaving: " << left.error() << "\n";
          return 2;
        }
        return 0;
      }
      if (std::chrono::steady_clock::now() >= until) break;
      for (std::size_t j = 0; j < elements; ++j)
        data[j] = (g.rank() + 1) * static_cast<std::int64_t>(j + 1) + k;
      troupe::tensor_view t{data.data(), troupe::dtype::int64, elements, troupe::device::cpu()};
      auto r = g.allreduce(t, {c::reduce_op::sum, op_timeout}).wait(op_timeout + 10s);
      if (!r) {
        ++failures;
        put("failed/" + name + "/" + std::to_string(failures),
            std::to_string(mono_ns()) + " " + std::string(troupe::to_string(r.error().code())) +
                "\n" + r.error().message());
        if (r.error().code() != troupe::errc::membership_changed) {
          std::cerr << name << ": " << r.error() << "\n";
          return 2;
        }
        if (auto h = svc->health(); !h) return evicted(h.error());
        break;  // rebuild for the new epoch
      }
      for (std::size_t j = 0; j < elements; ++j) {
        const std::int64_t want = sum_ranks * static_cast<std::int64_t>(j + 1) + n * k;
        if (data[j] != want) {
          const std::string why = "epoch " + std::to_string(v->epoch.number) + " op " +
                                  std::to_string(k) + " element " + std::to_string(j) + ": got " +
                                  std::to_string(data[j]) + ", want " + std::to_string(want);
          std::cerr << name << ": " << why << "\n";
          put("bad/" + name, why);
          return 4;
        }
      }
      if (!resumed_recorded) {
        put("resumed/" + name + "/" + std::to_string(v->epoch.number), std::to_string(mono_ns()));
        resumed_recorded = true;
      }
      put("ok/" + name,
          std::to_string(v->epoch.number) + " " + std::to_string(n) + " " + std::to_string(k + 1));
      std::this_thread::sleep_for(5ms);
    }
  }
  std::cerr << name << ": nobody set 'stop' within a minute\n";
  return 2;
}
