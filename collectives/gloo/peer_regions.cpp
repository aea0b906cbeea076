#include <troupe/collectives/gloo/peer_regions.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// What /proc/<pid>/fd/<fd> (pid 0: this process's) points to: the memory file's name as
// the kernel shows it.
std::string link_of(pid_t pid, int fd) {
  const auto path = pid == 0 ? strcat("/proc/self/fd/", fd) : strcat("/proc/", pid, "/fd/", fd);
  char buf[256];
  const auto n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::string memfd_link(std::uint64_t id) {
  return strcat("/memfd:", shared_region_name(id), " (deleted)");
}

}  // namespace

peer_regions::~peer_regions() {
  for (const auto& e : entries_) unmap(e);
}

void peer_regions::unmap(const entry& e) noexcept { ::munmap(e.here, e.theirs.bytes); }

std::byte* peer_regions::local(pid_t pid, const shared_region& region, std::uintptr_t theirs,
                               std::size_t bytes) {
  if (region.id == 0 || theirs < region.base || bytes > region.bytes ||
      theirs - region.base > region.bytes - bytes)
    return nullptr;
  const auto offset = theirs - region.base;
  for (const auto& e : entries_)
    if (e.pid == pid && e.theirs.id == region.id && e.theirs.bytes == region.bytes)
      return e.here + offset;
  if (std::find(refused_.begin(), refused_.end(), pid) != refused_.end()) return nullptr;
  drop_freed(pid);
  auto* here = map(pid, region);
  if (!here) {
    refused_.push_back(pid);
    return nullptr;
  }
  if (entries_.size() == max_mapped) {
    unmap(entries_.front());
    entries_.erase(entries_.begin());
  }
  entries_.push_back({pid, region, here});
  ++mapped_total_;
  return here + offset;
}

void peer_regions::drop_freed(pid_t pid) {
  std::erase_if(entries_, [&](const entry& e) {
    if (e.pid != pid || link_of(pid, e.theirs.fd) == memfd_link(e.theirs.id)) return false;
    unmap(e);
    return true;
  });
}

std::byte* peer_regions::map(pid_t pid, const shared_region& region) {
  auto refuse = [&](const char* step, int e) -> std::byte* {
    TROUPE_LOG(log_level::debug, "collectives", "cannot map the shared host buffers of pid ", pid,
               " (", step, ": ", std::strerror(e),
               "); copies from and into them take system calls");
    return nullptr;
  };
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return refuse("pidfd_open", errno);
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, region.fd, 0));
  const int getfd_errno = errno;
  ::close(pidfd);
  if (fd < 0) return refuse("pidfd_getfd", getfd_errno);
  // The descriptor must still hold the buffer its owner published, all of it.
  struct stat st {};
  if (link_of(0, fd) != memfd_link(region.id) || ::fstat(fd, &st) != 0 ||
      static_cast<std::size_t>(st.st_size) < region.bytes) {
    ::close(fd);
    return refuse("checking the buffer's memory file", ESTALE);
  }
  void* p = ::mmap(nullptr, region.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) return refuse("mmap", map_errno);
  return static_cast<std::byte*>(p);
}

}  // namespace troupe::collectives::gloo_shm
