// The one place where NCCL's and CUDA's result codes become troupe errors.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string_view>

#include <troupe/core/error.hpp>

namespace troupe::collectives {

/// The errc of an NCCL result:
///   ncclUnhandledCudaError -> unavailable   (a CUDA call inside NCCL failed)
///   ncclSystemError        -> connection_lost (a socket or system call failed; usually a peer)
///   ncclRemoteError        -> connection_lost (a remote peer failed)
///   ncclInternalError      -> internal
///   ncclInvalidArgument    -> invalid_argument
///   ncclInvalidUsage       -> invalid_argument
///   ncclInProgress         -> timeout        (still in progress when we stopped waiting)
///   anything else          -> internal
errc nccl_errc(ncclResult_t r) noexcept;

/// An error for `call` (e.g. "ncclAllReduce") failing with `r`; adds NCCL's own text and,
/// when `comm` is given, its last error message.
troupe::error nccl_error(ncclResult_t r, std::string_view call, ncclComm_t comm = nullptr);

/// The errc of a CUDA runtime result: no device or driver -> unavailable, out of memory ->
/// unavailable, invalid value/handle -> invalid_argument, anything else -> internal.
errc cuda_errc(cudaError_t r) noexcept;
troupe::error cuda_error(cudaError_t r, std::string_view call);

}  // namespace troupe::collectives
