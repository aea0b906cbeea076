// rendezvous_demo: N worker processes find each other through the embedded TCP store,
// exchange their device maps, validate them as a static group, and each prints its
// reverse device maps and device list. What an RPC agent does at init, in ~150 lines.
//
//   troupe-run --standalone --nproc-per-node 4 rendezvous_demo
//                                            under a launcher (troupe-run, torchrun,
//                                            srun): each worker opens the job's store from
//                                            its environment, scoped to this attempt
//   rendezvous_demo --workers 4              without a launcher: host the store, start
//                                            4 workers, wait
//   rendezvous_demo --workers 4 --bad-map    one worker maps to a worker that does not
//                                            exist: every worker fails with the same error
//   rendezvous_demo --store tcp://H:P --rank R --workers N    run one worker by hand
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <troupe/core/cluster_env.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/log.hpp>
#include <troupe/devicemap/derive.hpp>
#include <troupe/devicemap/validate.hpp>
#include <troupe/devicemap/worker_device_info.hpp>
#include <troupe/store/cluster_store.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/rendezvous.hpp>
#include <troupe/store/tcp_store_server.hpp>

extern char** environ;

namespace {

using namespace troupe;
using namespace std::chrono_literals;

struct options {
  int workers = 4;
  int rank = -1;  // -1: the launching process
  std::string store_url;
  bool from_launcher = false;   // the store from the launcher's environment
  std::string prefix = "demo";  // key prefix of this run's exchange
  bool bad_map = false;
  duration timeout = 30s;
};

int usage(const std::string& why) {
  std::fprintf(stderr,
               "rendezvous_demo: %s\nusage: rendezvous_demo [--workers N] [--bad-map] "
               "[--timeout 30s] [--store tcp://HOST:PORT --rank R]\n",
               why.c_str());
  return 2;
}

std::string name_of(int rank) { return "worker" + std::to_string(rank); }

// The device record this worker brings: CPU tensors go to the next worker's CPU, and
// when GPUs are visible, this worker's GPU (rank mod count) goes to the next one's.
worker_device_info my_record(const options& o) {
  worker_device_info me;
  me.name = name_of(o.rank);
  me.device_count = cuda_device_count().value_or(0);
  auto& next = me.maps[name_of((o.rank + 1) % o.workers)];
  (void)next.set(device::cpu(), device::cpu());
  if (me.device_count > 0)
    (void)next.set(*device::cuda(o.rank % me.device_count),
                   *device::cuda((o.rank + 1) % me.device_count));
  if (o.bad_map && o.rank == o.workers - 1)
    (void)me.maps["trainer7"].set(device::cpu(), device::cpu());
  return me;
}

int run_worker(const options& o) {
  set_log_identity(name_of(o.rank));
  // Under a launcher, the job's store scoped to this attempt (a restart never reads the
  // records of an earlier one); by hand, the store named on the command line.
  expected<std::shared_ptr<store>> s = make_error(errc::not_found, "no store");
  if (o.from_launcher) {
    auto env = detect_cluster_env();
    if (!env) return std::fprintf(stderr, "%s\n", env.error().to_string().c_str()), 1;
    auto job = open_cluster_store(*env, o.timeout);
    if (job)
      s = job->scoped;
    else
      s = std::move(job).error();
  } else {
    store_options so;
    so.timeout = o.timeout;
    so.connect_timeout = o.timeout;
    auto c = connect_store(o.store_url, so);
    if (c)
      s = std::shared_ptr<store>(std::move(*c));
    else
      s = std::move(c).error();
  }
  if (!s) {
    std::fprintf(stderr, "%s: %s\n", name_of(o.rank).c_str(), s.error().to_string().c_str());
    return 1;
  }
  auto me = my_record(o);
  auto gathered = all_gather(**s, o.prefix + "/records", o.rank, o.workers, encode(me), o.timeout);
  if (!gathered) {
    std::fprintf(stderr, "%s: %s\n", me.name.c_str(), gathered.error().to_string().c_str());
    return 1;
  }
  std::vector<worker_device_info> all;
  for (auto& blob : *gathered) {
    auto rec = decode_worker_device_info(blob);
    if (!rec) {
      std::fprintf(stderr, "%s: %s\n", me.name.c_str(), rec.error().to_string().c_str());
      return 1;
    }
    all.push_back(std::move(*rec));
  }
  auto setup = resolve_device_setup(me.name, all, group_kind::static_group);
  if (!setup) {
    std::printf("%s: init refused: %s\n", me.name.c_str(), setup.error().to_string().c_str());
    return 3;
  }
  std::printf("%s: %d workers, device count %d, reverse maps %s, devices %s\n", me.name.c_str(),
              o.workers, me.device_count, to_string(setup->reverse_maps).c_str(),
              to_string(setup->devices).c_str());
  std::fflush(stdout);
  if (auto b = barrier(**s, o.prefix + "/done", o.rank, o.workers, o.timeout); !b) {
    std::fprintf(stderr, "%s: %s\n", me.name.c_str(), b.error().to_string().c_str());
    return 1;
  }
  return 0;
}

int run_launcher(const options& o) {
  auto server = tcp_store_server::start({});
  if (!server) return usage(server.error().to_string());
  std::string url = "tcp://127.0.0.1:" + std::to_string((*server)->port());
  std::printf("embedded store listening on %s; starting %d workers\n", url.c_str() + 6, o.workers);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.workers; ++r) {
    std::vector<std::string> args{"rendezvous_demo",
                                  "--store",
                                  url,
                                  "--rank",
                                  std::to_string(r),
                                  "--workers",
                                  std::to_string(o.workers),
                                  "--timeout",
                                  format_duration(o.timeout)};
    if (o.bad_map) args.push_back("--bad-map");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ)) {
      std::fprintf(stderr, "cannot start worker %d: %s\n", r, std::strerror(rc));
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  // Workers bound every wait by --timeout, so these waits end.
  int failed = 0;
  for (int r = 0; r < o.workers; ++r) {
    int status = 0;
    waitpid(pids[static_cast<std::size_t>(r)], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed) {
    std::printf("%d of %d workers failed\n", failed, o.workers);
    return 1;
  }
  std::printf("all %d workers agreed on the group's device maps\n", o.workers);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--bad-map") {
      o.bad_map = true;
    } else if (a == "--workers" || a == "--rank" || a == "--store" || a == "--timeout") {
      const char* v = value();
      if (!v) return usage("missing value after " + a);
      if (a == "--store") {
        o.store_url = v;
      } else if (a == "--timeout") {
        auto d = parse_duration(v);
        if (!d) return usage(d.error().message());
        o.timeout = *d;
      } else {
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        if (*end != '\0' || n < (a == "--rank" ? 0 : 1) || n > 1024)
          return usage(a + " takes a whole number" + (a == "--rank" ? " >= 0" : " from 1 to 1024") +
                       ", got '" + v + "'");
        (a == "--rank" ? o.rank : o.workers) = static_cast<int>(n);
      }
    } else {
      return usage("unknown argument '" + a + "'");
    }
  }
  // Started by a launcher (troupe-run, torchrun, srun): one worker, from the environment.
  if (o.rank < 0) {
    if (auto env = detect_cluster_env()) {
      o.rank = env->rank;
      o.workers = env->world_size;
      o.from_launcher = true;
    } else if (env.error().code() != errc::not_found) {
      return usage(env.error().message());
    }
  }
  if (o.rank >= 0) {
    if (o.store_url.empty() && !o.from_launcher) return usage("--rank needs --store");
    if (o.rank >= o.workers) return usage("--rank must be below --workers");
    return run_worker(o);
  }
  return run_launcher(o);
}
