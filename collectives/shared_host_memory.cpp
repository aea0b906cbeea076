#include <troupe/collectives/shared_host_memory.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <troupe/core/strcat.hpp>

namespace troupe::collectives {

namespace {

constexpr std::size_t page = 4096;

// The live buffers by base address. Lookups take the lock: one per single-copy operation,
// against a system call or more saved.
struct registry {
  std::mutex mutex;
  std::map<std::uintptr_t, shared_region> by_base;
  std::uint64_t next_id = 1;
  // How many buffers are live: a process that has none looks no further, without the lock.
  std::atomic<std::size_t> live{0};
};

registry& regions() {
  static auto* r = new registry;  // never destroyed: static tensors may outlive any order
  return *r;
}

// One buffer: unregistered, unmapped and closed when the last tensor holding it goes.
struct region_owner {
  shared_region region;
  ~region_owner() {
    {
      auto& r = regions();
      std::lock_guard lock(r.mutex);
      r.by_base.erase(region.base);
      r.live.fetch_sub(1, std::memory_order_relaxed);
    }
    // The pages go now, from every process's mapping: the other members keep theirs
    // mapped until they next map one of this process's buffers (gloo/peer_regions.cpp),
    // which would hold the memory until then and leave them the work of freeing it.
    ::fallocate(region.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                static_cast<off_t>(region.bytes));
    ::munmap(reinterpret_cast<void*>(region.base), region.bytes);
    ::close(region.fd);
  }
};

}  // namespace

std::string shared_region_name(std::uint64_t id) { return strcat("troupe-shared-", id); }

expected<tensor> shared_host_tensor(dtype type, std::vector<std::int64_t> shape) {
  if (element_size(type) == 0)
    return make_error(errc::invalid_argument, "shared_host_tensor: dtype ", static_cast<int>(type),
                      " is not one of troupe::dtype's values");
  // Bytes, with every product checked: a shape whose size overflows is refused, not wrapped
  // around to a small allocation.
  bool empty = false;
  for (auto d : shape) {
    if (d < 0)
      return make_error(errc::invalid_argument, "shared_host_tensor: dimension ", d,
                        " is negative; every dimension must be 0 or more");
    empty = empty || d == 0;
  }
  std::size_t nbytes = empty ? 0 : element_size(type);
  for (auto d : shape)
    if (!empty && __builtin_mul_overflow(nbytes, static_cast<std::size_t>(d), &nbytes))
      return make_error(errc::invalid_argument, "shared_host_tensor: the shape's ", shape.size(),
                        " dimensions make more bytes than this machine can address");
  if (nbytes == 0) return tensor::wrap(nullptr, type, std::move(shape));
  const std::size_t bytes = (nbytes + page - 1) / page * page;
  std::uint64_t id = 0;
  {
    auto& r = regions();
    std::lock_guard lock(r.mutex);
    id = r.next_id++;
  }
  auto refused = [&](const char* step, int e) {
    return make_error(errc::unavailable, "shared_host_tensor: ", step, " of ", bytes,
                      " bytes failed (", std::strerror(e),
                      "); free memory or raise the limit, or allocate the tensor in ordinary "
                      "memory (collectives then copy it with a system call)");
  };
  const int fd = ::memfd_create(shared_region_name(id).c_str(), MFD_CLOEXEC);
  if (fd < 0) return refused("memfd_create", errno);
  // Reserved now, so that running out of memory is this error and not a SIGBUS later.
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    ::close(fd);
    return refused("reserving the memory", e);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return refused("mmap", e);
  }
  auto owner = std::make_shared<region_owner>();
  owner->region = {fd, id, reinterpret_cast<std::uintptr_t>(p), bytes};
  {
    auto& r = regions();
    std::lock_guard lock(r.mutex);
    r.by_base.emplace(owner->region.base, owner->region);
    r.live.fetch_add(1, std::memory_order_relaxed);
  }
  return tensor::wrap(p, type, std::move(shape), device::cpu(), {}, std::move(owner));
}

std::optional<shared_region> find_shared_region(const void* p, std::size_t bytes) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  auto& r = regions();
  // A buffer made on another thread and handed to this one came with a happens-before
  // edge, after which this load sees its count.
  if (r.live.load(std::memory_order_relaxed) == 0) return std::nullopt;
  std::lock_guard lock(r.mutex);
  auto it = r.by_base.upper_bound(at);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const auto& region = it->second;
  if (at + bytes > region.base + region.bytes || at + bytes < at) return std::nullopt;
  return region;
}

}  // namespace troupe::collectives
