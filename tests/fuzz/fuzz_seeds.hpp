// Each fuzz target defines its seeds: valid encodings that the random driver mutates, so
// that mutated inputs reach past the first checks. libFuzzer builds do not use them.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::fuzz {

std::vector<std::vector<std::uint8_t>> seeds();

}  // namespace troupe::fuzz
