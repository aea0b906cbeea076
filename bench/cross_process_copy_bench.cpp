// The limits under the one-copy collectives of one host (collectives/gloo/
// shared_memory_single_copy.cpp and Open MPI's cross-memory attach alike): on this machine,
// what one system call costs, what process_vm_readv and process_vm_writev of n bytes
// between two processes cost, and what memcpy of the same n bytes within one process
// costs. A collective that copies once with a system call cannot beat the first two; two
// plain copies through shared memory are bounded by the third, plus the transfer of the
// lines between the CPUs' caches that these figures leave out (both processes' buffers
// stay where they are: in the caches of the CPU that copies).
//
//   cross_process_copy_bench [--min BYTES] [--max BYTES] [--iters N] [--rounds R]
//
// Sizes from --min to --max (default 4 KiB to 4 MiB), each four times the last. For each
// size, R rounds (default 5) that each time the three copies in turn, N times each (default
// 20000 up to 64 KiB, 2000 up to 1 MiB, 200 above); the table shows the median of the
// rounds' means, in microseconds. A child process (forked, its buffers written after the
// fork so that their pages are its own) is the other side of the system calls.
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::size_t min = 4 << 10;
  std::size_t max = 4 << 20;
  int iters = 0;
  int rounds = 5;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "cross_process_copy_bench: %s\n"
               "usage: cross_process_copy_bench [--min BYTES] [--max BYTES] [--iters N] "
               "[--rounds R]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("'" + a + "' needs a value, or is not an option").c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n == 0)
      usage(("'" + a + " " + v + "': give a positive whole number").c_str());
    if (a == "--min")
      o.min = n;
    else if (a == "--max")
      o.max = n;
    else if (a == "--iters")
      o.iters = static_cast<int>(std::min<unsigned long long>(n, 100'000'000));
    else if (a == "--rounds")
      o.rounds = static_cast<int>(std::min<unsigned long long>(n, 1000));
    else
      usage(("unknown option '" + a + "'").c_str());
  }
  if (o.min > o.max) usage("--min is above --max");
  if (o.max > (std::size_t{1} << 30)) usage("--max is above 1 GiB");
  return o;
}

// Microseconds per call of `f`, over `n` calls.
template <class F>
double mean_us(int n, F&& f) {
  const auto start = clock_type::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// One transfer of `bytes` between `mine` here and `theirs` in `pid`; exits on failure (the
// figures would mean nothing).
void cross_copy(pid_t pid, char* mine, char* theirs, std::size_t bytes, bool write) {
  for (std::size_t done = 0; done < bytes;) {
    iovec local{mine + done, bytes - done};
    iovec remote{theirs + done, bytes - done};
    const auto n = write ? ::process_vm_writev(pid, &local, 1, &remote, 1, 0)
                         : ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      std::fprintf(stderr, "cross_process_copy_bench: process_vm_%s of the child failed: %s\n",
                   write ? "writev" : "readv", n < 0 ? std::strerror(errno) : "no progress");
      std::exit(1);
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::printf("#");
  for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");
  std::fflush(stdout);

  // The child's buffers lie at the same addresses as the parent's (fork); the child writes
  // them, so that their pages are its own, says so through `ready`, and waits on `done`.
  std::vector<char> src(o.max), dst(o.max), local_src(o.max, 1), local_dst(o.max, 2);
  int ready[2], done[2];
  if (::pipe(ready) != 0 || ::pipe(done) != 0) {
    std::perror("cross_process_copy_bench: pipe");
    return 1;
  }
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("cross_process_copy_bench: fork");
    return 1;
  }
  if (child == 0) {
    ::close(done[1]);  // so that the parent's exit ends the read below
    ::close(ready[0]);
    std::memset(src.data(), 3, src.size());
    std::memset(dst.data(), 4, dst.size());
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    (void)!::read(done[0], &c, 1);  // the parent's end closes when it exits
    ::_exit(0);
  }
  ::close(done[0]);
  ::close(ready[1]);
  char c = 0;
  if (::read(ready[0], &c, 1) != 1) {
    std::fprintf(stderr, "cross_process_copy_bench: the child did not start\n");
    return 1;
  }

  std::vector<double> call, yield;
  for (int r = 0; r < o.rounds; ++r) {
    call.push_back(mean_us(200000, [] { ::syscall(SYS_getppid); }));
    yield.push_back(mean_us(200000, [] { ::sched_yield(); }));
  }
  std::printf("system call (getppid): %.3f us, sched_yield: %.3f us\n", median(call),
              median(yield));
  std::printf("%12s %14s %14s %12s %12s %12s\n", "bytes", "readv_us", "writev_us", "memcpy_us",
              "readv/memcpy", "writev/memcpy");
  for (std::size_t bytes = o.min; bytes <= o.max; bytes *= 4) {
    const int iters = o.iters > 0            ? o.iters
                      : bytes <= (64u << 10) ? 20000
                      : bytes <= (1u << 20)  ? 2000
                                             : 200;
    std::vector<double> readv, writev, copy;
    for (int r = 0; r < o.rounds; ++r) {
      readv.push_back(
          mean_us(iters, [&] { cross_copy(child, dst.data(), src.data(), bytes, false); }));
      writev.push_back(
          mean_us(iters, [&] { cross_copy(child, src.data(), dst.data(), bytes, true); }));
      copy.push_back(mean_us(iters, [&] {
        std::memcpy(local_dst.data(), local_src.data(), bytes);
        asm volatile("" : : "r"(local_dst.data()) : "memory");  // keep every copy
      }));
    }
    const double rv = median(readv), wv = median(writev), mc = median(copy);
    std::printf("%12zu %14.2f %14.2f %12.2f %12.2f %12.2f\n", bytes, rv, wv, mc, rv / mc, wv / mc);
    std::fflush(stdout);
  }
  ::close(done[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return 0;
}
