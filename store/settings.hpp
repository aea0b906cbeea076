// The environment settings the store module reads. See core/setting.hpp.
#pragma once

#include <troupe/core/setting.hpp>

namespace troupe::settings {

inline constexpr setting job_secret{
    "TROUPE_JOB_SECRET", "unset (troupe-run makes one for a job of one node)",
    "the job's secret: the TCP store (troupe-store, troupe-run's store, a store rank 0 hosts, "
    "`connect_store` clients) and the RPC handshake require it. troupe-run sets it for its "
    "workers (`--secret-file`, else this variable, else a fresh one for a job of one node); "
    "the older name `TROUPE_STORE_SECRET` is read when it is unset (docs/security.md)",
    "TROUPE_STORE_SECRET"};

inline constexpr setting tls_cert{
    "TROUPE_TLS_CERT", "unset (no TLS)",
    "this process's certificate (PEM), signed by the job's CA. With `TROUPE_TLS_KEY` and "
    "`TROUPE_TLS_CA` it turns on mutual TLS for the RPC agent's TCP connections and for the "
    "TCP store's (troupe-store, troupe-run's store, `connect_store` clients): every process "
    "presents its certificate and refuses a peer whose certificate the job's CA did not sign, "
    "and a peer without TLS. Set all three on every worker and store of the job, or none; "
    "same-host local sockets stay plain (docs/security.md)"};
inline constexpr setting tls_key{
    "TROUPE_TLS_KEY", "unset (no TLS)",
    "the private key (PEM, unencrypted) of `TROUPE_TLS_CERT`; keep it readable only by the "
    "job's user"};
inline constexpr setting tls_ca{
    "TROUPE_TLS_CA", "unset (no TLS)",
    "the job's CA certificate (PEM): peers must present a certificate it signed. Use a CA "
    "that signs only the job's (or the cluster's) certificates: every certificate it signed "
    "is let in, whatever its name"};

/// The store module's settings, in the order of the generated table.
setting_list store_settings();

}  // namespace troupe::settings
