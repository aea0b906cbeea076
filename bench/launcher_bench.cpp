// launcher_bench: how fast a launcher gets N workers running, and how fast it has them
// running again after one crashes. Measures troupe-run and, when given, torchrun
// (--no_python) launching this same binary as the worker, in the same run.
//
//   launcher_bench --troupe-run build/launcher/troupe-run --torchrun /usr/bin/torchrun
//                  --nproc 4 --reps 5
//
// The worker (this binary with "worker DIR") writes DIR/start.<attempt>.<rank> holding
// CLOCK_MONOTONIC nanoseconds when it starts; rank 0 of attempt 0 exits 1 once DIR/crash
// exists, after writing DIR/crashed; everyone exits 0 once DIR/stop exists. Times:
//   to running:    the last start of attempt 0, minus the moment the launcher was spawned
//   crash to running: the last start of attempt 1, minus the crash
// Needs no troupe library: plain POSIX, so it also runs against any launcher.
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.hpp"
namespace fs = std::filesystem;

namespace {

long long now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void write_stamp(const fs::path& file) {
  { std::ofstream(file.string() + ".tmp") << now_ns(); }
  fs::rename(file.string() + ".tmp", file);
}

long long read_stamp(const fs::path& file) {
  long long v = 0;
  std::ifstream(file) >> v;
  return v;
}

std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

int worker(const fs::path& dir) {
  const std::string attempt = env("TORCHELASTIC_RESTART_COUNT", "0");
  const std::string rank = env("RANK", "0");
  write_stamp(dir / ("start." + attempt + "." + rank));
  for (;;) {
    if (fs::exists(dir / "stop")) return 0;
    if (attempt == "0" && rank == "0" && fs::exists(dir / "crash")) {
      write_stamp(dir / "crashed");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The newest stamp of attempt `attempt` once all `n` exist, or -1 after `timeout_s`.
long long wait_all(const fs::path& dir, int attempt, int n, int timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    long long last = 0;
    int count = 0;
    for (int r = 0; r < n; ++r) {
      fs::path f = dir / ("start." + std::to_string(attempt) + "." + std::to_string(r));
      if (!fs::exists(f)) break;
      last = std::max(last, read_stamp(f));
      ++count;
    }
    if (count == n) return last;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return -1;
}

struct sample {
  double to_running_s = -1;
  double crash_to_running_s = -1;
};

sample measure(const std::vector<std::string>& launcher_args, int nproc, const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The launcher's arguments end with "/proc/self/exe worker <dir>": fill in both.
  std::vector<std::string> args = launcher_args;
  args.back() = dir.string();
  args[args.size() - 3] = fs::read_symlink("/proc/self/exe").string();
  sample s;
  const long long t0 = now_ns();
  auto launcher =
      troupe::test::child_process::start(args, {.output = (dir / "launcher.log").string()});
  if (!launcher.started()) {
    std::fprintf(stderr, "%s\n", launcher.start_error().c_str());
    return s;
  }
  long long running = wait_all(dir, 0, nproc, 60);
  if (running > 0) {
    s.to_running_s = static_cast<double>(running - t0) / 1e9;
    std::ofstream(dir / "crash") << 1;
    long long again = wait_all(dir, 1, nproc, 60);
    if (again > 0)
      s.crash_to_running_s = static_cast<double>(again - read_stamp(dir / "crashed")) / 1e9;
  }
  std::ofstream(dir / "stop") << 1;
  launcher.wait(std::chrono::seconds(120));
  return s;
}

double median(std::vector<double> v) {
  v.erase(std::remove(v.begin(), v.end(), -1.0), v.end());
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "worker") return worker(argv[2]);
  std::string troupe_run;
  std::string torchrun;
  int nproc = 4;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--troupe-run")
      troupe_run = argv[i + 1];
    else if (flag == "--torchrun")
      torchrun = argv[i + 1];
    else if (flag == "--nproc")
      nproc = std::atoi(argv[i + 1]);
    else if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
  }
  if (troupe_run.empty() || nproc < 1 || reps < 1) {
    std::fprintf(stderr,
                 "usage: launcher_bench --troupe-run PATH [--torchrun PATH] [--nproc 4] "
                 "[--reps 5]\n");
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / ("launcher-bench-" + std::to_string(::getpid()));
  const std::string n = std::to_string(nproc);
  struct launcher {
    std::string name;
    std::vector<std::string> args;
  };
  std::vector<launcher> launchers{
      {"troupe-run --standalone",
       {troupe_run, "--standalone", "--nproc-per-node", n, "--max-restarts", "1", "--redirects",
        "3", "--log-dir", (dir / "logs").string(), "/proc/self/exe", "worker", ""}}};
  if (!torchrun.empty()) {
    // torch 1.13's torchrun on Python 3.11 needs explicit --redirects/--tee values.
    launchers.push_back(
        {"torchrun --standalone",
         {torchrun, "--standalone", "--nproc_per_node", n, "--max_restarts", "1", "--redirects=9:1",
          "--tee=9:1", "--no_python", "/proc/self/exe", "worker", ""}});
    launchers.push_back({"torchrun --standalone --monitor_interval 0.1",
                         {torchrun, "--standalone", "--nproc_per_node", n, "--max_restarts", "1",
                          "--monitor_interval", "0.1", "--redirects=9:1", "--tee=9:1",
                          "--no_python", "/proc/self/exe", "worker", ""}});
  }
  std::printf("%-46s %14s %20s   (nproc %d, median of %d)\n", "launcher", "to running [s]",
              "crash to running [s]", nproc, reps);
  for (const auto& l : launchers) {
    std::vector<double> up;
    std::vector<double> again;
    for (int r = 0; r < reps; ++r) {
      auto s = measure(l.args, nproc, dir / "run");
      up.push_back(s.to_running_s);
      again.push_back(s.crash_to_running_s);
    }
    std::printf("%-46s %14.4f %20.4f\n", l.name.c_str(), median(up), median(again));
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return 0;
}
