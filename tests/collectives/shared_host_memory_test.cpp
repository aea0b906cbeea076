// Shared host tensors (collectives/shared_host_memory.hpp) on their own: what they hold,
// how they are found, and what they leave when freed.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <algorithm>
#include <fstream>
#include <string>

#include <troupe/collectives/shared_host_memory.hpp>

using namespace troupe;
using namespace troupe::collectives;

namespace {

// Lines of /proc/self/maps that map shared host tensors' memory files.
int shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:troupe-shared-") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("a shared host tensor is a contiguous CPU tensor of zeros of the shape asked for") {
  auto t = shared_host_tensor(dtype::float32, {3, 1000});
  REQUIRE(t);
  CHECK(t->type() == dtype::float32);
  CHECK(t->shape() == std::vector<std::int64_t>{3, 1000});
  CHECK(t->is_contiguous());
  CHECK(t->dev() == device::cpu());
  CHECK(t->nbytes() == 12000);
  auto values = t->as_span<float>();
  CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
  values[2999] = 4.5f;
  CHECK(t->as_span<float>()[2999] == 4.5f);
}

TEST_CASE(
    "a shared host tensor's memory is found by any range inside it, on whole pages, and no "
    "longer once the tensor is freed") {
  const int before = shared_mappings();
  std::uint64_t id = 0;
  std::uintptr_t base = 0;
  {
    auto t = shared_host_tensor(dtype::int64, {1000});  // 8000 bytes: two pages
    REQUIRE(t);
    CHECK(shared_mappings() == before + 1);
    auto* p = static_cast<std::byte*>(t->data());
    auto whole = find_shared_region(p, 8000);
    REQUIRE(whole);
    CHECK(whole->base == reinterpret_cast<std::uintptr_t>(p));
    CHECK(whole->bytes == 8192);
    CHECK(whole->fd >= 0);
    CHECK(whole->id != 0);
    auto inside = find_shared_region(p + 4000, 4192);
    REQUIRE(inside);
    CHECK(inside->id == whole->id);
    CHECK_FALSE(find_shared_region(p + 4000, 4193));  // runs past its pages
    CHECK_FALSE(find_shared_region(p - 1, 2));
    int ordinary = 0;
    CHECK_FALSE(find_shared_region(&ordinary, sizeof(ordinary)));
    id = whole->id;
    base = whole->base;
  }
  CHECK(shared_mappings() == before);
  CHECK_FALSE(find_shared_region(reinterpret_cast<const void*>(base), 1));
  // Ids are never reused.
  auto next = shared_host_tensor(dtype::int64, {1000});
  REQUIRE(next);
  auto region = find_shared_region(next->data(), 8);
  REQUIRE(region);
  CHECK(region->id > id);
}

TEST_CASE("a shared host tensor lives as long as any copy of it") {
  const int before = shared_mappings();
  tensor copy;
  {
    auto t = shared_host_tensor(dtype::uint8, {5000});
    REQUIRE(t);
    t->as_span<std::uint8_t>()[4999] = 7;
    copy = *t;
  }
  CHECK(shared_mappings() == before + 1);
  CHECK(copy.as_span<std::uint8_t>()[4999] == 7);
  copy = tensor();
  CHECK(shared_mappings() == before);
}

TEST_CASE(
    "a freed shared host tensor's memory is released at once, even from another mapping of "
    "it that outlives the tensor") {
  std::byte* other = nullptr;
  std::size_t bytes = 0;
  {
    auto t = shared_host_tensor(dtype::uint8, {3 * 4096});
    REQUIRE(t);
    auto values = t->as_span<std::uint8_t>();
    std::fill(values.begin(), values.end(), std::uint8_t{7});
    auto region = find_shared_region(t->data(), values.size());
    REQUIRE(region);
    bytes = region->bytes;
    // As another member maps it (gloo/peer_regions.cpp), here through the same descriptor.
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, region->fd, 0);
    REQUIRE(p != MAP_FAILED);
    other = static_cast<std::byte*>(p);
    CHECK(other[bytes - 1] == std::byte{7});
  }
  // The pages are gone: what the other mapping reads now is the holes' zeros.
  CHECK(other[0] == std::byte{0});
  CHECK(other[bytes - 1] == std::byte{0});
  ::munmap(other, bytes);
}

TEST_CASE(
    "an empty shared host tensor holds no memory, and a negative dimension, a size past the "
    "address space or an unknown dtype is refused by name") {
  auto empty = shared_host_tensor(dtype::float32, {0, 4});
  REQUIRE(empty);
  CHECK(empty->numel() == 0);
  CHECK(empty->data() == nullptr);
  auto empty_of_huge = shared_host_tensor(dtype::float32, {std::int64_t{1} << 40, 0, 1 << 30});
  REQUIRE(empty_of_huge);
  CHECK(empty_of_huge->numel() == 0);
  auto negative = shared_host_tensor(dtype::float32, {4, -1});
  REQUIRE_FALSE(negative);
  CHECK(negative.error().code() == errc::invalid_argument);
  CHECK(negative.error().message().find("dimension -1 is negative") != std::string::npos);
  auto huge = shared_host_tensor(dtype::float64, {std::int64_t{1} << 40, std::int64_t{1} << 30});
  REQUIRE_FALSE(huge);
  CHECK(huge.error().code() == errc::invalid_argument);
  CHECK(huge.error().message().find("more bytes than this machine can address") !=
        std::string::npos);
  auto unknown = shared_host_tensor(static_cast<dtype>(200), {4});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == errc::invalid_argument);
  CHECK(unknown.error().message().find("dtype 200") != std::string::npos);
}
