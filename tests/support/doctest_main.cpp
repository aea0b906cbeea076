// main of every suite: the doctest runner, or a peer role when the suite's binary was
// started as its own peer process (support/peer_main.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "support/peer_main.hpp"

namespace troupe_test {

std::optional<int> run_peer_role_if_asked() {
  const char* name = std::getenv("TROUPE_TEST_PEER");
  if (name == nullptr || *name == '\0') return std::nullopt;
  auto it = peer_roles().find(name);
  if (it == peer_roles().end()) {
    std::fprintf(stderr, "TROUPE_TEST_PEER=%s names no peer role of this test binary\n", name);
    return 64;
  }
  const char* arg = std::getenv("TROUPE_TEST_PEER_ARG");
  return it->second(arg ? arg : "");
}

}  // namespace troupe_test

int main(int argc, char** argv) {
  if (auto rc = troupe_test::run_peer_role_if_asked()) {
    std::fflush(nullptr);
    return *rc;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
