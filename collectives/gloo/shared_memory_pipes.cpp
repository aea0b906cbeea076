// The pipes of a gloo group's single-copy allgathers (shared_memory.hpp, segment::allgather;
// shared_memory_single_copy.cpp decides when they run), and of its broadcasts from 64 KiB
// where the members cannot read one another's memory (segment::broadcast).
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

// A broadcast through the pipes (segment::broadcast_pipes) hands the data over in pieces
// of this size, two at a time in each pipe: the root splices piece k while the others read
// piece k - 1. A piece spans 31 pages at most (unaligned), two 62, in a pipe of 64
// (pipe_bytes_wanted()), so a splice never finds its pipe full.
constexpr std::size_t pipe_piece_bytes = 120 << 10;
constexpr std::size_t pipe_depth = 2;

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
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !splice_to(r, own, bytes)) return false;
  return true;
}

bool segment::splice_to(int r, const std::byte* from, std::size_t bytes) {
  iovec v{const_cast<std::byte*>(from), bytes};
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
        errc::internal, what(), " (collective #", seq_, "): handing this member's data to rank ",
        world(r), " through its pipe failed after ", bytes - v.iov_len, " of ", bytes, " bytes (",
        e == EAGAIN ? "the pipe is full" : std::strerror(e),
        "); set TROUPE_GLOO_SHM_SINGLE_COPY=0 to copy through shared memory instead"));
  }
  return true;
}

bool segment::read_pipe(int r, std::byte* to, std::size_t bytes) {
  for (std::size_t got = 0; got < bytes;) {
    const auto n = ::read(pipe_from_[static_cast<std::size_t>(r)], to + got, bytes - got);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // The member splices all it hands over before it publishes: what is missing now
    // never comes.
    const int e = n < 0 ? errno : EIO;
    mark_failed();
    return fail(make_error(errc::internal, what(), " (collective #", seq_, "): rank ", world(r),
                           "'s data was not whole in its pipe (", got, " of ", bytes, " bytes; ",
                           e == EAGAIN ? "no more to read" : std::strerror(e),
                           "); set TROUPE_GLOO_SHM_SINGLE_COPY=0 to copy through shared "
                           "memory instead"));
  }
  return true;
}

// Piece k: the root waits until every other member read piece k - pipe_depth (its phase
// then reached base + k - pipe_depth + 1), splices piece k into the pipe to each and
// publishes (base + k + 1); the others wait for that phase, read the piece into their
// tensor and publish the same phase. The root's data stays as it is until broadcast()'s
// last wait, which every member passes only once all have read all of it: the pipes hold
// references to the root's pages, not copies.
bool segment::broadcast_pipes(std::byte* data, std::size_t bytes, int root,
                              clock::time_point deadline) {
  const std::uint64_t base = phase_;
  const std::size_t pieces = (bytes + pipe_piece_bytes - 1) / pipe_piece_bytes;
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t off = k * pipe_piece_bytes;
    const std::size_t len = std::min(pipe_piece_bytes, bytes - off);
    if (rank_ == root) {
      if (k >= pipe_depth &&
          !wait_all(base + k - pipe_depth + 1, deadline, "did not read the data", false))
        return false;
      if (!splice_own(data + off, len)) return false;
    } else {
      if (!wait_one(root, base + k + 1, deadline, "did not write the data")) return false;
      if (!read_pipe(root, data + off, len)) return false;
    }
    publish();
  }
  if (rank_ != root) ++single_copy_reads_;
  return true;
}

bool segment::read_pipes(std::size_t bytes, std::byte* dst) {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !read_pipe(r, dst + bytes * static_cast<std::size_t>(r), bytes)) return false;
  return true;
}

}  // namespace troupe::collectives::gloo_shm
