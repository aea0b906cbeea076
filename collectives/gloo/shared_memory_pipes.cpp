// The pipes of a gloo group's single-copy allgathers (shared_memory.hpp, segment::allgather;
// shared_memory_single_copy.cpp decides when they run).
//
// A member hands its allgather block to another by splicing the block's pages into a pipe
// (vmsplice: the pipe holds references to the pages, no bytes are copied), and the other
// reads them straight into its output: one copy, as with process_vm_readv, but the pages
// are taken by the kernel's lockless fast walk of the owner's own page tables instead of
// one by one through the other process's, and no permission to read another process's
// memory is needed (Yama, seccomp and containers often refuse process_vm_readv). On a
// 2-vCPU VM a world-2 exchange of 32 KiB per member took 4.4-4.7 us through the pipes
// against 6.5 us with process_vm_readv, and 10-12 against 14-16.5 us at 128 KiB
// (bench/RESULTS.md).
//
// The pipes are FIFOs named after the segment in /dev/shm, one per ordered pair of
// members, so that the members (other processes, with nothing else in common) can open
// them by name; their names are unlinked with the segment's, and a rank 0 killed while
// creating its group leaves them to the next group's sweep (shm_names.hpp). A member
// splices only into empty pipes, never more than a pipe holds, and returns only after the
// others have read its block: an operation leaves every pipe empty, and after a failure
// the segment is not used again.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/collectives/gloo/shm_names.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// A group of n members needs n(n-1) pipes of 64 pages each; past 8 members (56 pipes,
// 3,584 pages) a few groups would reach a user's pipe-user-pages-soft (16,384 pages by
// default), beyond which the kernel refuses to enlarge pipes.
constexpr int max_pipe_members = 8;

}  // namespace

std::string segment::make_pipes(const std::string& name) {
  if (size_ > max_pipe_members) return strcat("more than ", max_pipe_members, " members");
  for (int from = 0; from < size_; ++from)
    for (int to = 0; to < size_; ++to) {
      if (from == to) continue;
      const auto path = pipe_path(name, from, to);
      if (::mkfifo(path.c_str(), 0600) != 0) {
        const int e = errno;
        unlink_pipes(name);
        return strcat("mkfifo(", path, "): ", std::strerror(e));
      }
    }
  return "";
}

void segment::open_pipes(const std::string& name) {
  pipe_to_.assign(static_cast<std::size_t>(size_), -1);
  pipe_from_.assign(static_cast<std::size_t>(size_), -1);
  std::uint32_t least = ~std::uint32_t{0};
  std::string why;
  for (int r = 0; r < size_ && why.empty(); ++r) {
    if (r == rank_) continue;
    // O_RDWR: opening a FIFO neither waits for the other end nor fails without it.
    for (auto [fd, path] :
         {std::pair{&pipe_to_[static_cast<std::size_t>(r)], pipe_path(name, rank_, r)},
          std::pair{&pipe_from_[static_cast<std::size_t>(r)], pipe_path(name, r, rank_)}}) {
      *fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
      if (*fd < 0) {
        why = strcat("open(", path, "): ", std::strerror(errno));
        break;
      }
    }
    if (!why.empty()) break;
    const int to = pipe_to_[static_cast<std::size_t>(r)];
    // Refused beyond /proc/sys/fs/pipe-max-size or the user's pipe pages: the pipe keeps
    // its size, and the capacity below tells.
    (void)::fcntl(to, F_SETPIPE_SZ, static_cast<int>(pipe_bytes_wanted()));
    const int capacity = ::fcntl(to, F_GETPIPE_SZ);
    if (capacity < 0) {
      why = strcat("F_GETPIPE_SZ: ", std::strerror(errno));
      break;
    }
    least = std::min(least, static_cast<std::uint32_t>(capacity));
  }
  if (!why.empty()) {
    TROUPE_LOG(log_level::debug, "collectives", "rank ", world(rank_),
               " cannot open its allgather pipes (", why, ")");
    close_pipes();
    least = 0;
  }
  at(rank_).pipe_bytes.store(pipe_to_.empty() ? 0 : least);
}

void segment::unlink_pipes(const std::string& name) const {
  for (int from = 0; from < size_; ++from)
    for (int to = 0; to < size_; ++to)
      if (from != to) ::unlink(pipe_path(name, from, to).c_str());
}

void segment::agree_on_pipes() {
  std::uint32_t least = pipe_to_.empty() ? 0 : ~std::uint32_t{0};
  for (int r = 0; r < size_; ++r) least = std::min(least, at(r).pipe_bytes.load());
  use_pipes_ = least >= pipe_bytes_wanted();
  if (!use_pipes_) {
    if (least > 0)
      TROUPE_LOG(log_level::debug, "collectives", "rank ", world(rank_),
                 ": the allgather pipes hold ", least, " bytes, ", pipe_bytes_wanted(),
                 " are needed (see /proc/sys/fs/pipe-max-size and pipe-user-pages-soft)");
    close_pipes();
  }
}

void segment::close_pipes() noexcept {
  for (auto* fds : {&pipe_to_, &pipe_from_}) {
    for (int fd : *fds)
      if (fd >= 0) ::close(fd);
    fds->clear();
  }
  use_pipes_ = false;
}

bool segment::splice_own(const std::byte* own, std::size_t bytes) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    iovec v{const_cast<std::byte*>(own), bytes};
    while (v.iov_len > 0) {
      const auto n = ::vmsplice(pipe_to_[static_cast<std::size_t>(r)], &v, 1, SPLICE_F_NONBLOCK);
      if (n > 0) {
        v.iov_base = static_cast<std::byte*>(v.iov_base) + n;
        v.iov_len -= static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      const int e = n < 0 ? errno : EIO;
      mark_failed();
      return fail(make_error(
          errc::internal, what(), " (collective #", seq_, "): handing this member's block to rank ",
          world(r), " through its pipe failed after ", bytes - v.iov_len, " of ", bytes, " bytes (",
          e == EAGAIN ? "the pipe is full" : std::strerror(e),
          "); set TROUPE_GLOO_SHM_SINGLE_COPY=0 to copy blocks through shared memory instead"));
    }
  }
  return true;
}

bool segment::read_pipes(std::size_t bytes, std::byte* dst) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto* block = dst + bytes * static_cast<std::size_t>(r);
    for (std::size_t got = 0; got < bytes;) {
      const auto n = ::read(pipe_from_[static_cast<std::size_t>(r)], block + got, bytes - got);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      // Every member splices its whole block before it publishes: what is missing now
      // never comes.
      const int e = n < 0 ? errno : EIO;
      mark_failed();
      return fail(make_error(errc::internal, what(), " (collective #", seq_, "): rank ", world(r),
                             "'s block was not whole in its pipe (", got, " of ", bytes, " bytes; ",
                             e == EAGAIN ? "no more to read" : std::strerror(e),
                             "); set TROUPE_GLOO_SHM_SINGLE_COPY=0 to copy blocks through "
                             "shared memory instead"));
    }
  }
  return true;
}

}  // namespace troupe::collectives::gloo_shm
