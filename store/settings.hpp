// The environment settings the store module reads. See core/setting.hpp.
#pragma once

#include "core/setting.hpp"

namespace troupe::settings {

inline constexpr setting job_secret{
    "TROUPE_JOB_SECRET", "unset (troupe-run makes one for a job of one node)",
    "the job's secret: the TCP store (troupe-store, troupe-run's store, a store rank 0 hosts, "
    "`connect_store` clients) and the RPC handshake require it. troupe-run sets it for its "
    "workers (`--secret-file`, else this variable, else a fresh one for a job of one node); "
    "the older name `TROUPE_STORE_SECRET` is read when it is unset (docs/security.md)",
    "TROUPE_STORE_SECRET"};

/// The store module's settings, in the order of the generated table.
setting_list store_settings();

}  // namespace troupe::settings
