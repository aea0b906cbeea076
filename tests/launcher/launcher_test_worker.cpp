// A worker for the troupe-run tests. Usage: launcher_test_worker MODE DIR
//   env         records its environment and exits 0
//   fail-first  records; local rank 1 fails (exit 1) on attempt 0, the rest exit 0
//   fail        records; local rank 0 writes to stderr and exits 7, the rest exit 0
//   wait        records, then runs until DIR/stop exists (or it is signalled)
//   throw       records; local rank 1 throws out of troupe::run_main (an error file), the
//               rest exit 0
//   store       records, connects to TROUPE_STORE_URL under TROUPE_STORE_PREFIX, and meets
//               every rank there (a counter and a wait); writes DIR/store.rank<RANK> when met
//   elastic     joins the job's membership (TROUPE_STORE_PREFIX/membership) as
//               worker<RANK> with a 60 s heartbeat timeout, writes
//               DIR/elastic.rank<RANK>.restart<TROUPE_RESTART_COUNT> (its pid) and prints
//               "elastic: worker<RANK> pid <pid> restart <n> joined"; rank 1 of restart 0
//               then kills itself with SIGKILL. The others wait for epoch WORLD_SIZE + 2
//               (every join, one death, one replacement); rank 0 writes those epochs to
//               DIR/history and prints them ("history: " lines); all leave and exit 0.
//   follow      joins the job's membership as worker<RANK> (heartbeat timeout from
//               TROUPE_HEARTBEAT_TIMEOUT), writes the current epoch to DIR/members.rank<RANK>
//               and prints it ("members: <number> <names, sorted, comma-separated>")
//               whenever it changes, and leaves and exits 0 when DIR/stop exists or it gets
//               SIGTERM.
// The record is DIR/round<TROUPE_ROUND>.rank<RANK>: "KEY=VALUE" lines and "PID=<pid>",
// written to a temporary name and renamed, so a reader never sees half a file.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/error_file.hpp>
#include <troupe/membership/service.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>

namespace {

volatile sig_atomic_t follow_stop_requested = 0;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

void record(const std::string& dir) {
  const char* names[] = {"RANK",
                         "LOCAL_RANK",
                         "GROUP_RANK",
                         "GROUP_WORLD_SIZE",
                         "ROLE_RANK",
                         "ROLE_NAME",
                         "LOCAL_WORLD_SIZE",
                         "WORLD_SIZE",
                         "ROLE_WORLD_SIZE",
                         "MASTER_ADDR",
                         "MASTER_PORT",
                         "TROUPE_RESTART_COUNT",
                         "TROUPE_MAX_RESTARTS",
                         "TROUPE_RUN_ID",
                         "TROUPE_ROUND",
                         "TROUPE_STORE_URL",
                         "TROUPE_STORE_PREFIX",
                         "TORCHELASTIC_RESTART_COUNT",
                         "TORCHELASTIC_MAX_RESTARTS",
                         "TORCHELASTIC_RUN_ID",
                         "OMP_NUM_THREADS",
                         "TROUPE_ERROR_FILE",
                         "TORCHELASTIC_ERROR_FILE",
                         "TROUPE_LOCAL_ADDR",
                         "NCCL_SOCKET_IFNAME",
                         "GLOO_SOCKET_IFNAME",
                         "TROUPE_JOB_SECRET",
                         "TROUPE_ELASTIC"};
  const std::string name = dir + "/round" + env("TROUPE_ROUND") + ".rank" + env("RANK");
  {
    std::ofstream out(name + ".tmp");
    for (const char* n : names) out << n << '=' << env(n) << '\n';
    out << "PID=" << ::getpid() << '\n';
  }
  std::filesystem::rename(name + ".tmp", name);
}

// What a worker of the elastic modes holds: the job's store, its membership scope and its
// place in the membership.
struct joined_job {
  std::shared_ptr<troupe::store> base;
  std::shared_ptr<troupe::prefix_store> scoped;
  troupe::expected<std::unique_ptr<troupe::membership::service>> svc =
      troupe::make_error(troupe::errc::internal, "not joined");
};

// Connects to TROUPE_STORE_URL and joins the job's membership (TROUPE_STORE_PREFIX/membership)
// as worker<RANK>, with these heartbeat settings (zero: the service's defaults, from the
// environment). 0 on success,
// else the exit code to return (3: the store, 4: the join), with the reason on stderr.
int join_job_membership(joined_job& job, std::chrono::milliseconds heartbeat_timeout,
                        std::chrono::milliseconds heartbeat_interval) {
  troupe::store_options so;
  so.timeout = std::chrono::seconds(20);
  so.connect_timeout = std::chrono::seconds(20);
  auto opened = troupe::connect_store(env("TROUPE_STORE_URL"), so);
  if (!opened) {
    std::fprintf(stderr, "store: %s\n", opened.error().to_string().c_str());
    return 3;
  }
  job.base = std::move(*opened);
  job.scoped =
      std::make_shared<troupe::prefix_store>(job.base, env("TROUPE_STORE_PREFIX") + "/membership");
  troupe::membership::service_options o;
  o.name = "worker" + env("RANK");
  o.heartbeat_timeout = heartbeat_timeout;
  o.heartbeat_interval = heartbeat_interval;
  job.svc = troupe::membership::service::join(job.scoped, o, std::chrono::seconds(20));
  if (!job.svc) {
    std::fprintf(stderr, "join: %s\n", job.svc.error().to_string().c_str());
    return 4;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: launcher_test_worker MODE DIR\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string dir = argv[2];
  record(dir);
  std::printf("worker rank %s started\n", env("RANK").c_str());
  std::fflush(stdout);
  if (mode == "env") return 0;
  if (mode == "fail-first") {
    if (env("TROUPE_RESTART_COUNT") == "0" && env("LOCAL_RANK") == "1") {
      std::fprintf(stderr, "failing on purpose on attempt 0\n");
      return 1;
    }
    return 0;
  }
  if (mode == "fail") {
    if (env("LOCAL_RANK") == "0") {
      std::fprintf(stderr, "fatal: rank %s cannot go on\n", env("RANK").c_str());
      return 7;
    }
    return 0;
  }
  if (mode == "throw") {
    return troupe::run_main([] {
      if (env("LOCAL_RANK") == "1")
        throw std::runtime_error("rank " + env("RANK") + ": the loss became NaN");
      return 0;
    });
  }
  if (mode == "store") {
    troupe::store_options so;
    so.timeout = std::chrono::seconds(20);
    so.connect_timeout = std::chrono::seconds(20);
    auto base = troupe::connect_store(env("TROUPE_STORE_URL"), so);
    if (!base) {
      std::fprintf(stderr, "store: %s\n", base.error().to_string().c_str());
      return 3;
    }
    troupe::prefix_store scoped(**base, env("TROUPE_STORE_PREFIX") + "/test-meeting");
    const auto world = std::stoll(env("WORLD_SIZE"));
    auto n = scoped.add("arrived", 1, std::chrono::seconds(20));
    if (n && *n == world) n = scoped.add("all-in", 1, std::chrono::seconds(20));
    std::vector<std::string> keys{"all-in"};
    auto met = n ? scoped.wait(keys, std::chrono::seconds(20)) : troupe::expected<void>(n.error());
    if (!met) {
      std::fprintf(stderr, "store: %s\n", met.error().to_string().c_str());
      return 4;
    }
    std::ofstream(dir + "/store.rank" + env("RANK")) << "met\n";
    return 0;
  }
  if (mode == "elastic") {
    namespace m = troupe::membership;
    // Far longer than the test waits: the dead worker leaves the membership only because
    // troupe-run takes it out.
    joined_job job;
    if (int failed = join_job_membership(job, std::chrono::seconds(60), std::chrono::seconds(1)))
      return failed;
    auto& base = job.base;
    auto& scoped = job.scoped;
    auto& svc = job.svc;
    const std::string restart = env("TROUPE_RESTART_COUNT");
    std::ofstream(dir + "/elastic.rank" + env("RANK") + ".restart" + restart) << ::getpid() << '\n';
    std::printf("elastic: worker%s pid %d restart %s joined\n", env("RANK").c_str(),
                static_cast<int>(::getpid()), restart.c_str());
    std::fflush(stdout);
    if (env("RANK") == "1" && restart == "0") ::raise(SIGKILL);
    const auto world = static_cast<std::uint64_t>(std::stoll(env("WORLD_SIZE")));
    const std::uint64_t last = world + 2;
    auto reached = (*svc)->wait_for_epoch(last, std::chrono::seconds(30));
    if (!reached) {
      std::fprintf(stderr, "epoch %llu: %s\n", static_cast<unsigned long long>(last),
                   reached.error().to_string().c_str());
      return 5;
    }
    if (env("RANK") == "0") {
      std::string history;
      for (std::uint64_t n = 1; n <= last; ++n) {
        auto e = m::read_epoch(*scoped, n, std::chrono::seconds(10));
        if (!e) {
          std::fprintf(stderr, "epoch %llu: %s\n", static_cast<unsigned long long>(n),
                       e.error().to_string().c_str());
          return 6;
        }
        history += m::encode(*e);
      }
      std::ofstream(dir + "/history.tmp") << history;
      std::filesystem::rename(dir + "/history.tmp", dir + "/history");
      std::size_t from = 0;
      for (auto nl = history.find('\n'); nl != std::string::npos; nl = history.find('\n', from)) {
        std::printf("history: %s\n", history.substr(from, nl - from).c_str());
        from = nl + 1;
      }
      std::fflush(stdout);
    }
    // Everyone has seen epoch 5 before anyone leaves (leaving makes epochs 6, 7, ...).
    troupe::prefix_store meeting(*base, env("TROUPE_STORE_PREFIX") + "/test-done");
    auto n = meeting.add("done", 1, std::chrono::seconds(20));
    std::vector<std::string> keys{"all-done"};
    if (n && *n == static_cast<std::int64_t>(world))
      (void)meeting.set("all-done", std::string_view("1"));
    if (!n || !meeting.wait(keys, std::chrono::seconds(20))) return 7;
    auto left = (*svc)->shutdown(std::chrono::seconds(10));
    return left ? 0 : 8;
  }
  if (mode == "follow") {
    struct sigaction sa {};
    sa.sa_handler = [](int) { follow_stop_requested = 1; };
    ::sigaction(SIGTERM, &sa, nullptr);
    // The heartbeat timeout from TROUPE_HEARTBEAT_TIMEOUT (the service's default).
    joined_job job;
    if (int failed =
            join_job_membership(job, std::chrono::milliseconds(0), std::chrono::milliseconds(0)))
      return failed;
    auto& svc = job.svc;
    const std::string file = dir + "/members.rank" + env("RANK");
    std::uint64_t shown = 0;
    // Polling the epoch and a file is this worker's own business; the tests wait on conditions.
    while (follow_stop_requested == 0 && !std::filesystem::exists(dir + "/stop")) {
      const auto e = (*svc)->current();
      if (e.number != shown) {
        std::vector<std::string> names;
        for (const auto& member : e.members) names.push_back(member.name);
        std::sort(names.begin(), names.end());
        std::string line = std::to_string(e.number) + ' ';
        for (std::size_t i = 0; i < names.size(); ++i) line += (i > 0 ? "," : "") + names[i];
        std::ofstream(file + ".tmp") << line << '\n';
        std::filesystem::rename(file + ".tmp", file);
        std::printf("members: %s\n", line.c_str());
        std::fflush(stdout);
        shown = e.number;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto left = (*svc)->shutdown(std::chrono::seconds(10));
    return left ? 0 : 8;
  }
  if (mode == "wait") {
    // Polling a file is this worker's own business; the tests wait on conditions.
    while (!std::filesystem::exists(dir + "/stop"))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
