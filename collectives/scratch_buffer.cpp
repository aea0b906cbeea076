#include <troupe/collectives/scratch_buffer.hpp>

#include <cstring>
#include <vector>

namespace troupe::collectives {

#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
// nccl/device_memory.cpp: the only CUDA calls of this file's class.
namespace detail {
expected<void*> cuda_alloc_zeroed(int device_index, std::size_t nbytes);
void cuda_free(void* p) noexcept;
expected<void> cuda_copy(void* dst, const void* src, std::size_t nbytes, bool to_device);
}  // namespace detail
#endif

struct scratch_buffer::owner {
  std::vector<std::byte> host;
  void* device_memory = nullptr;
  ~owner() {
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
    if (device_memory) detail::cuda_free(device_memory);
#endif
  }
};

expected<scratch_buffer> scratch_buffer::make(device where, dtype type, std::size_t numel) {
  scratch_buffer b;
  b.memory_ = std::make_shared<owner>();
  std::size_t nbytes = numel * element_size(type);
  if (where.is_cpu()) {
    b.memory_->host.assign(nbytes, std::byte{0});
    b.view_ = {b.memory_->host.data(), type, numel, where};
    return b;
  }
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  auto p = detail::cuda_alloc_zeroed(where.index(), nbytes);
  if (!p) return std::move(p).error();
  b.memory_->device_memory = *p;
  b.view_ = {*p, type, numel, where};
  return b;
#else
  return make_error(errc::unavailable, "cannot place a scratch buffer on ", where.to_string(),
                    ": this build has no CUDA support (configure with TROUPE_WITH_CUDA=ON)");
#endif
}

expected<void> scratch_buffer::write(const void* src) const {
  if (!memory_) return make_error(errc::invalid_argument, "write to an empty scratch buffer");
  if (view_.where.is_cpu()) {
    std::memcpy(view_.data, src, view_.nbytes());
    return ok();
  }
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  return detail::cuda_copy(view_.data, src, view_.nbytes(), true);
#else
  return make_error(errc::internal, "a CUDA scratch buffer in a build without CUDA");
#endif
}

expected<void> scratch_buffer::read(void* dst) const {
  if (!memory_) return make_error(errc::invalid_argument, "read from an empty scratch buffer");
  if (view_.where.is_cpu()) {
    std::memcpy(dst, view_.data, view_.nbytes());
    return ok();
  }
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  return detail::cuda_copy(dst, view_.data, view_.nbytes(), false);
#else
  return make_error(errc::internal, "a CUDA scratch buffer in a build without CUDA");
#endif
}

}  // namespace troupe::collectives
