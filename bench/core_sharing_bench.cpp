// Whether two CPUs of this machine share a core right now: a copy loop timed on the first
// CPU alone, then on both at once, one thread each. Two CPUs of their own copy at once as
// fast as one alone (about 1.0x); two SMT siblings, or two vCPUs that the hypervisor runs
// on one core's threads, share its caches and execution units and each takes up to twice
// as long. On the 2-vCPU VMs of bench/RESULTS.md the answer changes within minutes (the
// twenty-first Open MPI entry): with the vCPUs on one core, lines pass between them at
// once and small collectives of both troupe and Open MPI take about 0.4 us, large copies
// halve; apart, small ones take 1.3-2 us. bench/mpi_compare.sh prints it with its noise
// checks, so that a table says which machine it ran on.
//
//   core_sharing_bench [--cpus A,B] [--bytes N] [--iters N]
//
// Defaults: CPUs 0 and 1, 1 MiB copied 5,000 times. Prints one line: both times in
// microseconds per copy and their ratio. Exits 1 when a CPU cannot be used (affinity
// refused, or fewer CPUs online) and 2 on a bad argument.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
  int cpu[2] = {0, 1};
  std::size_t bytes = 1 << 20;
  int iters = 5000;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "core_sharing_bench: %s\n"
               "usage: core_sharing_bench [--cpus A,B] [--bytes N] [--iters N]\n",
               why.c_str());
  std::exit(2);
}

unsigned long long positive(const std::string& opt, const char* v) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n == 0)
    usage("'" + opt + " " + v + "': give a positive whole number");
  return n;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("'" + a + "' needs a value, or is not an option");
    const char* v = argv[++i];
    if (a == "--cpus") {
      const char* comma = std::strchr(v, ',');
      if (!comma) usage(std::string("'--cpus ") + v + "': give two CPU numbers, as 0,1");
      const std::string first(v, comma);
      char* end_x = nullptr;
      char* end_y = nullptr;
      const long x = std::strtol(first.c_str(), &end_x, 10);
      const long y = std::strtol(comma + 1, &end_y, 10);
      if (first.empty() || comma[1] == '\0' || *end_x != '\0' || *end_y != '\0' || x < 0 || y < 0 ||
          x == y || x >= CPU_SETSIZE || y >= CPU_SETSIZE)
        usage(std::string("'--cpus ") + v + "': give two different CPU numbers, as 0,1");
      o.cpu[0] = static_cast<int>(x);
      o.cpu[1] = static_cast<int>(y);
    } else if (a == "--bytes") {
      o.bytes = static_cast<std::size_t>(std::min<unsigned long long>(positive(a, v), 1 << 30));
    } else if (a == "--iters") {
      o.iters = static_cast<int>(std::min<unsigned long long>(positive(a, v), 10'000'000));
    } else {
      usage("unknown option '" + a + "'");
    }
  }
  return o;
}

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// Microseconds per copy of `o.bytes` on `cpu`, between buffers of this thread's own; a
// negative figure when the thread cannot run there. `go` holds the start until both
// threads of a pair are ready.
double copy_loop(const options& o, int cpu, const std::atomic<int>* go) {
  if (!pin(cpu)) return -1;
  std::vector<char> from(o.bytes, 1), to(o.bytes, 2);
  std::memcpy(to.data(), from.data(), o.bytes);  // pages and caches warm
  if (go)
    while (go->load() == 0) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) {
    std::memcpy(to.data(), from.data(), o.bytes);
    // Keeps each copy from being folded into the next: the source changes a little.
    from[static_cast<std::size_t>(i) % o.bytes] = to[(static_cast<std::size_t>(i) * 7) % o.bytes];
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
             .count() /
         o.iters;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  double alone = 0, both[2] = {0, 0};
  std::thread([&] { alone = copy_loop(o, o.cpu[0], nullptr); }).join();
  std::atomic<int> go{0};
  std::thread a([&] { both[0] = copy_loop(o, o.cpu[0], &go); });
  std::thread b([&] { both[1] = copy_loop(o, o.cpu[1], &go); });
  go.store(1);
  a.join();
  b.join();
  if (alone < 0 || both[0] < 0 || both[1] < 0) {
    std::fprintf(stderr,
                 "core_sharing_bench: cannot run on CPU %d and CPU %d (is each online and "
                 "allowed to this process? see --cpus)\n",
                 o.cpu[0], o.cpu[1]);
    return 1;
  }
  const double together = (both[0] + both[1]) / 2;
  std::printf(
      "CPUs %d and %d: a %zu-byte memcpy took %.1f us alone, %.1f us each at once "
      "(%.2fx)\n",
      o.cpu[0], o.cpu[1], o.bytes, alone, together, together / alone);
  return 0;
}
