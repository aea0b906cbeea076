// GPU-labelled: runs on a machine with a CUDA device, reports itself skipped elsewhere.
#include <doctest/doctest.h>

#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/device.hpp>
#include "support/skip.hpp"

using namespace troupe;

TEST_CASE("the CUDA runtime reports at least one device on a GPU machine") {
  auto n = cuda_device_count();
  if (!n) TROUPE_SKIP_TEST("no CUDA device: " + n.error().message());
  CHECK(*n >= 1);
  MESSAGE("CUDA devices: " << *n);
}

TEST_CASE("without a device the reason says what to check") {
  auto n = cuda_device_count();
  if (n) TROUPE_SKIP_TEST("a CUDA device is present; nothing to explain");
  CHECK(n.error().code() == errc::unavailable);
  CHECK_FALSE(n.error().message().empty());
}
