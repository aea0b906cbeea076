#include <troupe/collectives/nccl/nccl_errors.hpp>

namespace troupe::collectives {

errc nccl_errc(ncclResult_t r) noexcept {
  switch (r) {
    case ncclUnhandledCudaError:
      return errc::unavailable;
    case ncclSystemError:
      return errc::connection_lost;
    case ncclRemoteError:
      return errc::connection_lost;
    case ncclInternalError:
      return errc::internal;
    case ncclInvalidArgument:
      return errc::invalid_argument;
    case ncclInvalidUsage:
      return errc::invalid_argument;
    case ncclInProgress:
      return errc::timeout;
    default:
      return errc::internal;
  }
}

troupe::error nccl_error(ncclResult_t r, std::string_view call, ncclComm_t comm) {
  const char* text = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  return make_error(nccl_errc(r), call, " failed: ", text ? text : "unknown NCCL error", " (",
                    static_cast<int>(r), ")", last && *last ? strcat("; ", last) : std::string());
}

errc cuda_errc(cudaError_t r) noexcept {
  switch (r) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorMemoryAllocation:
      return errc::unavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
      return errc::invalid_argument;
    default:
      return errc::internal;
  }
}

troupe::error cuda_error(cudaError_t r, std::string_view call) {
  return make_error(cuda_errc(r), call, " failed: ", cudaGetErrorName(r), ": ",
                    cudaGetErrorString(r));
}

}  // namespace troupe::collectives
