// A worker process for the multi-process store tests.
//   store_test_worker gather URL RANK WORLD   all_gather names, pass a barrier twice
//   store_test_worker hold-token URL          take the token, announce it, block forever
//   store_test_worker take-token URL          announce, then wait for the token
// Exits 0 on success; prints the reason and exits 1 otherwise.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <troupe/store/connect.hpp>
#include <troupe/store/membership_token.hpp>
#include <troupe/store/rendezvous.hpp>

namespace {

using namespace std::chrono_literals;

int fail(const std::string& what, const troupe::error& e) {
  std::cerr << "store_test_worker: " << what << ": " << e << std::endl;
  return 1;
}

int gather(troupe::store& s, int rank, int world) {
  std::string me = "worker-" + std::to_string(rank) + "-pid" + std::to_string(::getpid());
  auto names = troupe::all_gather(s, "names", rank, world, troupe::to_bytes(me), 30s);
  if (!names) return fail("all_gather", names.error());
  if (static_cast<int>(names->size()) != world) {
    std::cerr << "store_test_worker: got " << names->size() << " names\n";
    return 1;
  }
  for (int r = 0; r < world; ++r) {
    auto name = troupe::to_string((*names)[static_cast<std::size_t>(r)]);
    if (name.rfind("worker-" + std::to_string(r) + "-pid", 0) != 0) {
      std::cerr << "store_test_worker: rank " << r << " published '" << name << "'\n";
      return 1;
    }
  }
  for (int i = 0; i < 2; ++i)
    if (auto b = troupe::barrier(s, "done", rank, world, 30s); !b)
      return fail("barrier", b.error());
  if (auto seen = s.add("saw-all", 1, 10s); !seen) return fail("add", seen.error());
  return 0;
}

troupe::membership_token_options token_options() {
  troupe::membership_token_options o;
  o.ttl = 1s;
  return o;
}

int hold_token(troupe::store& s) {
  auto g = troupe::acquire_membership_token(s, "group/token", "doomed", 10s, token_options());
  if (!g) return fail("acquire", g.error());
  if (auto r = s.set("doomed/holding", std::string_view("1")); !r) return fail("set", r.error());
  // Hold the token until killed; the guard's thread keeps refreshing it meanwhile.
  auto never = s.get("never-written", 120s);
  return fail("the holder was not killed", never ? troupe::error() : never.error());
}

int take_token(troupe::store& s) {
  if (auto r = s.set("taker/waiting", std::string_view("1")); !r) return fail("set", r.error());
  auto g = troupe::acquire_membership_token(s, "group/token", "taker", 20s, token_options());
  if (!g) return fail("acquire", g.error());
  if (auto r = s.set("taker/acquired", std::string_view(g->record())); !r)
    return fail("set", r.error());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: store_test_worker MODE URL [RANK WORLD]\n";
    return 2;
  }
  std::string mode = argv[1];
  troupe::store_options o;
  o.connect_timeout = 20s;
  o.timeout = 30s;
  auto s = troupe::connect_store(argv[2], o);
  if (!s) return fail("connect", s.error());
  if (mode == "gather" && argc == 5) return gather(**s, std::stoi(argv[3]), std::stoi(argv[4]));
  if (mode == "hold-token") return hold_token(**s);
  if (mode == "take-token") return take_token(**s);
  std::cerr << "store_test_worker: unknown mode '" << mode << "'\n";
  return 2;
}
