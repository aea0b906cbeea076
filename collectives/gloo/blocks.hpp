// How the gloo backend's algorithms cut a run of elements among the members of a group.
// Internal to collectives/gloo.
#pragma once

#include <algorithm>
#include <cstddef>

namespace troupe::collectives::gloo_blocks {

/// Elements [offset, offset + count).
struct range {
  std::size_t offset;
  std::size_t count;
};

/// Block b when n blocks split `count` elements as evenly as possible (the first
/// count % n blocks get one more).
inline range block(std::size_t count, int n, int b) {
  auto un = static_cast<std::size_t>(n), ub = static_cast<std::size_t>(b);
  std::size_t base = count / un, rem = count % un;
  return {ub * base + std::min(ub, rem), base + (ub < rem ? 1 : 0)};
}

}  // namespace troupe::collectives::gloo_blocks
