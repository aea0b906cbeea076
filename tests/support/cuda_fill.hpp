// Test kernels for the GPU suites (compiled by nvcc into troupe_test_cuda_kernels): data
// written on a stream by a kernel that is still running when the host moves on, so that a
// copy that does not wait for the producing stream reads stale bytes and a test fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe_test {

/// Queues on `stream` (a cudaStream_t; null: the legacy default stream) a kernel that
/// first spins for about `spin_ms` milliseconds of device time and then writes
/// p[i] = seed + i for every i < count (32-bit words). Returns "" when queued, else the
/// CUDA error's text. The host does not wait.
std::string fill_after_spin(void* p, std::size_t count, std::uint32_t seed, void* stream,
                            int spin_ms);

/// The number of words of `p` (device memory, `count` words) that differ from seed + i,
/// after every operation queued so far on the device (copies it to the host and waits).
/// -1 when a CUDA call fails.
std::int64_t count_mismatches_on_device(const void* p, std::size_t count, std::uint32_t seed);

/// The same check for host memory.
std::int64_t count_mismatches_on_host(const void* p, std::size_t count, std::uint32_t seed);

}  // namespace troupe_test
