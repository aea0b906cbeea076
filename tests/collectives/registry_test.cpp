#include <doctest/doctest.h>

#include <cstdlib>

#include <troupe/collectives/registry.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/store/memory_store.hpp>

using namespace troupe;
using namespace troupe::collectives;

TEST_CASE("gloo is registered and a second backend of the same name is refused") {
  auto names = registered_backends();
  CHECK(std::find(names.begin(), names.end(), "gloo") != names.end());
  backend_info dup;
  dup.name = "gloo";
  dup.create = [](const group_spec&) -> expected<std::shared_ptr<process_group>> {
    return make_error(errc::internal, "never");
  };
  auto r = register_backend(dup);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::already_exists);
}

TEST_CASE("an unknown backend name is not_found and the error lists the known ones") {
  group_spec s;
  s.name = "g";
  s.root_store = std::make_shared<memory_store>();
  auto g = create_group("carrier-pigeon", s);
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::not_found);
  CHECK(g.error().message().find("gloo") != std::string::npos);
}

TEST_CASE("a registered backend is used by name and a non-viable one is refused") {
  backend_info b;
  b.name = "test-never-viable";
  b.description = "needs hardware this machine lacks";
  b.viable = [] { return false; };
  b.create = [](const group_spec&) -> expected<std::shared_ptr<process_group>> {
    return make_error(errc::internal, "must not be called");
  };
  REQUIRE(register_backend(b));
  group_spec s;
  s.name = "g";
  s.root_store = std::make_shared<memory_store>();
  auto g = create_group("test-never-viable", s);
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::unavailable);
}

TEST_CASE("the default backend follows TROUPE_BACKEND, else the devices") {
  ::setenv("TROUPE_BACKEND", "gloo", 1);
  CHECK(default_backend() == "gloo");
  ::setenv("TROUPE_BACKEND", "nccl", 1);
  CHECK(default_backend() == "nccl");
  ::unsetenv("TROUPE_BACKEND");
  auto n = cuda_device_count();
  bool gpus = n && *n > 0;
  CHECK(default_backend() == (gpus ? "nccl" : "gloo"));
}
