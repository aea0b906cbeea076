// The environment settings the collectives module reads. See core/setting.hpp.
#pragma once

#include <troupe/core/setting.hpp>

namespace troupe::settings {

inline constexpr setting backend{
    "TROUPE_BACKEND", "`nccl` with a GPU, else `gloo`",
    "the collective backend of new groups that name none (`gloo`, `nccl`)"};
inline constexpr setting gloo_shm{
    "TROUPE_GLOO_SHM", "on",
    "`0` makes gloo groups whose members share a host use loopback TCP instead of shared "
    "memory"};
inline constexpr setting gloo_shm_slot{
    "TROUPE_GLOO_SHM_SLOT", "1048576",
    "bytes of one shared-memory slot of a gloo group, 1 to 1 GiB (larger tensors go in "
    "pieces)"};
inline constexpr setting gloo_shm_single_copy{
    "TROUPE_GLOO_SHM_SINGLE_COPY", "auto",
    "whether a same-host gloo group's allgathers of 32-192 KiB per member copy each block "
    "once, from where it lies (through a pipe the owner splices its pages into, or with "
    "process_vm_readv where the pipes cannot be made), instead of twice through shared "
    "memory, which is faster while the inputs sit in the caches (unchanged between "
    "operations) and can be slower when they were just written or evicted: `auto` times "
    "both ways on the group's own allgathers and takes the faster, `1` always copies once, "
    "`0` never (docs/collectives.md); one member's `0` holds for all, `1` needs every member. "
    "Unless `0`, broadcasts from 64 KiB and allgathers from 256 KiB per member copy once "
    "too, where the members can read one another's memory (broadcasts also through the "
    "pipes); where the members outnumber the CPUs, broadcasts of 4-16 MiB only, and "
    "broadcasts from 512 KiB and allgathers from 256 KiB per member when every member's "
    "tensors of the last such operation were made with "
    "`troupe::collectives::shared_host_tensor`. Copies of such tensors are plain memory "
    "copies through the members' mappings of them, not system calls (docs/collectives.md, "
    "\"Shared host tensors\")"};
inline constexpr setting gloo_local_sndbuf{
    "TROUPE_GLOO_LOCAL_SNDBUF", "262144",
    "send buffer of same-host gloo TCP connections, in bytes (`0`: the kernel's autotuning)"};
inline constexpr setting gloo_loop_batch{
    "TROUPE_GLOO_LOOP_BATCH", "on",
    "`0` leaves Gloo's event-loop thread at its normal scheduling policy instead of "
    "SCHED_BATCH"};
inline constexpr setting gloo_host{
    "TROUPE_GLOO_HOST", "unset",
    "the address gloo binds and advertises, overriding `TROUPE_LOCAL_ADDR`'s choice for gloo "
    "alone"};
inline constexpr setting gloo_hierarchical{
    "TROUPE_GLOO_HIERARCHICAL", "on",
    "`0` makes gloo groups that span hosts run every allreduce over TCP between all members "
    "instead of reducing within each host over shared memory first (docs/collectives.md); "
    "one member saying `0` turns it off for the group"};
inline constexpr setting gloo_hierarchical_min{
    "TROUPE_GLOO_HIERARCHICAL_MIN", "0",
    "the smallest allreduce, in bytes, that a gloo group spanning hosts runs hierarchically "
    "(smaller ones go over TCP between all members); rank 0's value holds for the group"};
inline constexpr setting gloo_host_key{
    "TROUPE_GLOO_HOST_KEY", "unset",
    "for tests and diagnosis: the host identity a gloo member claims when its group finds "
    "which members share a host (unset: the host name and network namespace); members that "
    "claim different keys on one machine are treated as on different hosts"};
inline constexpr setting local_rank{
    "TROUPE_LOCAL_RANK", "`LOCAL_RANK`",
    "the local rank that picks a worker's CUDA device for NCCL groups (the device is this "
    "rank modulo the device count); `LOCAL_RANK` is read when it is unset, else the world "
    "rank is used",
    "LOCAL_RANK"};

/// The collectives module's settings, in the order of the generated table.
setting_list collectives_settings();

}  // namespace troupe::settings
