// A test suite's binary as its own peer process: a suite registers a role (a name and a
// function) with TROUPE_TEST_PEER_ROLE, starts "/proc/self/exe" with TROUPE_TEST_PEER=<name>
// and TROUPE_TEST_PEER_ARG=<text> in the environment, and the child runs that function
// from main (after every static initializer, CUDA's kernel registration included) instead
// of the test cases. One binary, so a bundle copied elsewhere needs no worker program.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace troupe_test {

using peer_function = std::function<int(const std::string& arg)>;

inline std::map<std::string, peer_function>& peer_roles() {
  static std::map<std::string, peer_function> roles;
  return roles;
}

struct peer_role {
  peer_role(const char* name, peer_function f) { peer_roles()[name] = std::move(f); }
};

/// The exit code of the peer role TROUPE_TEST_PEER names, run now; nullopt when the
/// variable is unset (a normal test run). An unknown role is exit code 64.
std::optional<int> run_peer_role_if_asked();

}  // namespace troupe_test

#define TROUPE_TEST_PEER_CONCAT2(a, b) a##b
#define TROUPE_TEST_PEER_CONCAT(a, b) TROUPE_TEST_PEER_CONCAT2(a, b)
#define TROUPE_TEST_PEER_ROLE(name, fn)                                                            \
  static const ::troupe_test::peer_role TROUPE_TEST_PEER_CONCAT(troupe_peer_role_, __LINE__)(name, \
                                                                                             fn)
