// TROUPE_SKIP_TEST("reason"): ends the current test case and makes CTest report it as
// skipped (the suites register SKIP_REGULAR_EXPRESSION "[troupe-skip]").
#pragma once

#include <cstdio>

#define TROUPE_SKIP_TEST(reason)                                    \
  do {                                                              \
    std::printf("[troupe-skip] %s\n", std::string(reason).c_str()); \
    std::fflush(stdout);                                            \
    return;                                                         \
  } while (false)
