// Each fuzz target defines its seeds: valid encodings that the random driver mutates, so
// that mutated inputs reach past the first checks. The libFuzzer builds start from them too
// (written as a corpus by the driver's --write-seeds; tests/fuzz/libfuzzer/).
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::fuzz {

std::vector<std::vector<std::uint8_t>> seeds();

}  // namespace troupe::fuzz
