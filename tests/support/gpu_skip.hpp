// The GPU suites' reason to skip: why no CUDA device is usable here, or "" when one is.
#pragma once

#include <string>

#include <troupe/core/cuda_runtime.hpp>

namespace troupe_test {

inline std::string no_gpu_reason() {
  auto n = troupe::cuda_device_count();
  if (!n) return "no usable CUDA device: " + n.error().to_string();
  if (*n < 1) return "no CUDA device present";
  return {};
}

}  // namespace troupe_test
