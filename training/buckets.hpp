// Gradient buckets: which parameters are all-reduced together. Parameters are taken in
// reverse registration order (a backward pass usually produces the last layer's
// gradients first), grouped by dtype and device, and a bucket is closed once it holds at
// least its byte cap: `first_cap_bytes` for the first bucket of each dtype/device (so
// that communication starts early), `cap_bytes` after that. A parameter larger than the
// cap gets a bucket of its own. Buckets are numbered in the order they fill, which is the
// order every rank launches them in.
#pragma once

#include <cstddef>
#include <vector>

#include <troupe/training/parameter.hpp>

namespace troupe::training {

struct bucket_plan {
  /// Parameter indices, in the order they join the bucket (reverse registration order).
  std::vector<std::size_t> params;
  dtype type = dtype::float32;
  device where;
  /// Elements and bytes in the bucket.
  std::size_t numel = 0;
  std::size_t nbytes = 0;
};

/// Plans the buckets of `params`. Caps of zero are refused (invalid_argument).
expected<std::vector<bucket_plan>> plan_buckets(const std::vector<parameter>& params,
                                                std::size_t first_cap_bytes, std::size_t cap_bytes);

}  // namespace troupe::training
