// A deterministic stand-in for libFuzzer, for builds without clang's -fsanitize=fuzzer:
// it calls the target's LLVMFuzzerTestOneInput with the target's seeds (valid encodings),
// then with mutations of them and with random bytes, from a fixed random seed, for a
// bounded time, and prints how many inputs it ran. A crash, a sanitizer report or an
// uncaught exception fails the run; so does a target returning non-zero.
//   <target> [--seconds=S] [--seed=N]     (defaults: 3 s, seed 1)
//   <target> --write-seeds=DIR             writes the seeds to DIR/seed-<n>, one file each,
//                                          as a corpus for the libFuzzer build, and exits
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_seeds.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using input = std::vector<std::uint8_t>;

// One mutation: flip, set, insert, erase, or overwrite a 4-byte field with a boundary value.
void mutate(input& in, std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n == 0 ? 1 : n)); };
  switch (rng() % 6) {
    case 0:
      if (!in.empty()) in[pick(in.size())] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      break;
    case 1:
      if (!in.empty()) in[pick(in.size())] = static_cast<std::uint8_t>(rng());
      break;
    case 2:
      in.insert(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size() + 1)),
                static_cast<std::uint8_t>(rng()));
      break;
    case 3:
      if (!in.empty()) in.erase(in.begin() + static_cast<std::ptrdiff_t>(pick(in.size())));
      break;
    case 4:
      in.resize(pick(in.size() + 1));  // truncate
      break;
    default: {
      static constexpr std::uint32_t boundary[] = {0,      1,          0x7f,      0xff,
                                                   0xffff, 0x7fffffff, 0xffffffff};
      if (in.size() >= 4) {
        std::uint32_t v = boundary[rng() % std::size(boundary)];
        std::memcpy(in.data() + pick(in.size() - 3), &v, 4);
      }
    }
  }
}

// Writes each seed to DIR/seed-<n>; 0 on success, 1 (with a message) if DIR cannot be
// made or a file cannot be written.
int write_seeds(const std::vector<input>& seeds, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create the seed folder '%s': %s\n", dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    const auto file = std::filesystem::path(dir) / ("seed-" + std::to_string(i));
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(seeds[i].data()),
              static_cast<std::streamsize>(seeds[i].size()));
    if (!out) {
      std::fprintf(stderr, "cannot write the seed file '%s'\n", file.c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seed file(s) to %s\n", seeds.size(), dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  std::uint64_t seed = 1;
  std::string seed_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) {
      seconds = std::strtod(a.c_str() + 10, nullptr);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else if (a.rfind("--write-seeds=", 0) == 0) {
      seed_dir = a.substr(14);
    } else {
      std::fprintf(stderr,
                   "unknown argument '%s'; use --seconds=S, --seed=N or --write-seeds=DIR\n",
                   argv[i]);
      return 2;
    }
  }
  std::vector<input> seeds = troupe::fuzz::seeds();
  if (!seed_dir.empty()) return write_seeds(seeds, seed_dir);
  std::mt19937_64 rng(seed);
  if (seeds.empty()) seeds.emplace_back();
  std::size_t runs = 0;
  auto run = [&](const input& in) {
    if (LLVMFuzzerTestOneInput(in.data(), in.size()) != 0) {
      std::fprintf(stderr, "the target returned non-zero for an input of %zu bytes\n", in.size());
      std::exit(1);
    }
    ++runs;
  };
  for (auto& s : seeds) run(s);
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    for (int batch = 0; batch < 256; ++batch) {
      input in;
      if (rng() % 8 == 0) {
        in.resize(rng() % 512);
        for (auto& b : in) b = static_cast<std::uint8_t>(rng());
      } else {
        in = seeds[rng() % seeds.size()];
        for (int m = 1 + static_cast<int>(rng() % 8); m > 0; --m) mutate(in, rng);
      }
      run(in);
    }
  }
  std::printf("%s: %zu inputs executed in %.1f s (seed %llu), no crash\n", argv[0], runs, seconds,
              static_cast<unsigned long long>(seed));
  return 0;
}
