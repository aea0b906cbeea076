#include <cuda_runtime.h>

#include <vector>

#include "support/cuda_fill.hpp"

namespace troupe_test {

namespace {

__global__ void spin_then_fill(std::uint32_t* p, std::size_t count, std::uint32_t seed,
                               long long spin_cycles) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
  }
  __syncthreads();
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    p[i] = seed + static_cast<std::uint32_t>(i);
}

std::string text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

}  // namespace

std::string fill_after_spin(void* p, std::size_t count, std::uint32_t seed, void* stream,
                            int spin_ms) {
  int dev = 0, khz = 0;
  if (auto e = cudaGetDevice(&dev); e != cudaSuccess) return text(e);
  if (auto e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
      e != cudaSuccess || khz <= 0)
    khz = 1'500'000;  // a guess when the attribute is missing: 1.5 GHz
  const long long cycles = static_cast<long long>(khz) * spin_ms;
  std::size_t blocks = (count + 255) / 256;
  if (blocks == 0) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  spin_then_fill<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<std::uint32_t*>(p), count, seed, cycles);
  if (auto e = cudaGetLastError(); e != cudaSuccess) return text(e);
  return {};
}

std::int64_t count_mismatches_on_host(const void* p, std::size_t count, std::uint32_t seed) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (w[i] != seed + static_cast<std::uint32_t>(i)) ++bad;
  return bad;
}

std::int64_t count_mismatches_on_device(const void* p, std::size_t count, std::uint32_t seed) {
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  std::vector<std::uint32_t> host(count);
  if (count > 0 && cudaMemcpy(host.data(), p, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return -1;
  return count_mismatches_on_host(host.data(), count, seed);
}

}  // namespace troupe_test
