// The environment settings core reads: timeouts, logging, the error file, this process's
// address, and the job's place that troupe-run hands to its workers. See core/setting.hpp.
#pragma once

#include <troupe/core/setting.hpp>

namespace troupe::settings {

inline constexpr setting default_timeout{
    "TROUPE_DEFAULT_TIMEOUT", "5m",
    "the timeout of every blocking operation given none (calls, store waits, rendezvous, "
    "collectives, init), as `250ms`, `30s`, `5m`, `1h` or seconds; a bad value is reported "
    "and ignored"};
inline constexpr setting logging_level{
    "TROUPE_LOG_LEVEL", "warn",
    "`trace`, `debug`, `info`, `warn`, `error` or `off`; a bad value is reported and ignored"};
inline constexpr setting error_file{
    "TROUPE_ERROR_FILE", "unset",
    "where a failing worker's `troupe::record_error` / `troupe::run_main` writes its root "
    "cause as JSON; troupe-run sets it per worker "
    "(`<log-dir>/<run-id>/attempt_<n>/<rank>/error.json`) and quotes the file in its failure "
    "report. torchrun's `TORCHELASTIC_ERROR_FILE` is read when it is unset",
    "TORCHELASTIC_ERROR_FILE"};
inline constexpr setting trace{
    "TROUPE_TRACE", "unset",
    "a directory: every process of the job records trace events (RPCs, collectives, launcher "
    "events) there as Chrome trace-event JSON, one file per process, and troupe-run merges "
    "its workers' files into one trace per attempt (docs/tracing.md); an unwritable directory "
    "is reported once and the job runs without tracing"};
inline constexpr setting local_addr{
    "TROUPE_LOCAL_ADDR", "derived",
    "this process's address for its job: the RPC agent, gloo and a store rank 0 hosts bind "
    "and advertise it; it must be an address of this host. troupe-run sets it "
    "(`--local-addr`). Unset: `TROUPE_SOCKET_IFNAME`'s address, else 127.0.0.1 when every "
    "rank runs on this host, else the host name's address (docs/multi-node.md)"};
inline constexpr setting socket_ifname{
    "TROUPE_SOCKET_IFNAME", "unset",
    "the network interface the job uses (e.g. `eth0`): its first IPv4 address is this "
    "process's (and troupe-run's node) address; troupe-run passes it on as "
    "`NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME` when those are unset"};
inline constexpr setting store_url{
    "TROUPE_STORE_URL", "set by troupe-run",
    "the job's store (`tcp://`, `etcd://`, `memory://`); under another launcher it names a "
    "store to use instead of the one rank 0 would host"};
inline constexpr setting store_prefix{
    "TROUPE_STORE_PREFIX", "set by troupe-run",
    "the key prefix of this round's workers; `troupe::init` and `init_rpc_from_env` scope "
    "their keys with it"};
inline constexpr setting run_id{"TROUPE_RUN_ID", "set by troupe-run",
                                "the job's id; its presence marks a troupe-run worker"};
inline constexpr setting rendezvous_round{"TROUPE_ROUND", "set by troupe-run",
                                          "the rendezvous round this worker belongs to"};
inline constexpr setting restart_count{"TROUPE_RESTART_COUNT", "set by troupe-run",
                                       "restarts of the job so far"};
inline constexpr setting max_restarts{"TROUPE_MAX_RESTARTS", "set by troupe-run",
                                      "restarts the job allows (`--max-restarts`)"};
inline constexpr setting elastic{
    "TROUPE_ELASTIC", "set by troupe-run (`--failure-policy replace`)",
    "`1`: a failed worker is replaced while the others run on, and the replacement joins the "
    "running job under the same store scope; workers must follow the job's membership "
    "(docs/membership.md) instead of forming a fixed world"};

inline constexpr setting metrics_file{
    "TROUPE_METRICS_FILE", "set by troupe-run (`--metrics-port`)",
    "where a worker writes its metrics snapshot, every second and at exit, for troupe-run's "
    "`/metrics` endpoint to read; troupe-run sets it per worker "
    "(`<log-dir>/<run-id>/attempt_<n>/<rank>/metrics`) when it serves metrics "
    "(docs/metrics.md)"};

/// core's settings, in the order of the generated table.
setting_list core_settings();

}  // namespace troupe::settings
