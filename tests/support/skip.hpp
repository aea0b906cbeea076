// TROUPE_SKIP_TEST("reason"): ends the current test case and makes CTest report it as
// skipped (the suites register SKIP_REGULAR_EXPRESSION "[troupe-skip]").
#pragma once

#include <cstdio>
#include <string>

namespace troupe_test {

/// Whether the running test case skipped itself (read by require_assertions.cpp, which
/// fails a GPU test case that neither skipped nor ran an assertion).
inline bool& current_test_skipped() {
  static bool skipped = false;
  return skipped;
}

}  // namespace troupe_test

#define TROUPE_SKIP_TEST(reason)                                    \
  do {                                                              \
    ::troupe_test::current_test_skipped() = true;                   \
    std::printf("[troupe-skip] %s\n", std::string(reason).c_str()); \
    std::fflush(stdout);                                            \
    return;                                                         \
  } while (false)
