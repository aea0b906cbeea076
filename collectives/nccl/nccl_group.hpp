// The "nccl" backend: CUDA tensors through one NCCL communicator per group.
//
// Threading: operations are queued on the group's own CUDA stream by the calling thread
// (ordered after the caller's stream with events); a watchdog thread polls their end
// events and the communicator's asynchronous error. On a timeout or a peer failure it
// aborts the communicator, asks the store which ranks did not arrive, and fails every
// pending work with that error, which stays the group's sticky error.
#pragma once

#include <troupe/collectives/registry.hpp>

namespace troupe::collectives {

/// The registry entry of the nccl backend (viable when CUDA devices are present).
backend_info nccl_backend_info();

/// The CUDA device a rank uses: TROUPE_LOCAL_RANK or LOCAL_RANK when set, else the world
/// rank, modulo `device_count`.
int nccl_device_for(int world_rank, int device_count);

}  // namespace troupe::collectives
