#include "collectives/nccl/nccl_comm.hpp"

#include <thread>

#include "collectives/nccl/nccl_errors.hpp"
#include "core/log.hpp"

namespace troupe::collectives {

namespace {
constexpr auto poll_interval = std::chrono::microseconds(200);
}

ncclConfig_t nccl_comm::config(const std::string& name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name.c_str();
  return c;
}

expected<std::unique_ptr<nccl_comm>> nccl_comm::init(int nranks, const ncclUniqueId& id, int rank,
                                                     const std::string& name, duration timeout) {
  ncclComm_t c = nullptr;
  auto cfg = config(name);
  auto r = ncclCommInitRankConfig(&c, nranks, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (c) (void)ncclCommAbort(c);
    return nccl_error(r, "ncclCommInitRankConfig");
  }
  std::unique_ptr<nccl_comm> comm(new nccl_comm(c, name));
  if (auto ready = comm->wait_ready("ncclCommInitRankConfig", timeout); !ready) {
    comm->abort();
    return make_error(ready.error().code(), "joining the communicator of group '", name,
                      "' as rank ", rank, " of ", nranks, ": ", ready.error().message());
  }
  return comm;
}

expected<std::unique_ptr<nccl_comm>> nccl_comm::split(int color, int key, const std::string& name,
                                                      duration timeout) {
  ncclComm_t child = nullptr;
  auto cfg = config(name);
  auto r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &cfg);
  TROUPE_TRY(check(r, "ncclCommSplit", timeout));
  if (color < 0 || child == nullptr) return std::unique_ptr<nccl_comm>();
  std::unique_ptr<nccl_comm> out(new nccl_comm(child, name));
  if (auto ready = out->wait_ready("ncclCommSplit", timeout); !ready) {
    out->abort();
    return std::move(ready).error();
  }
  return out;
}

nccl_comm::~nccl_comm() {
  if (state_.load() == state::live) {
    if (!finalize(std::chrono::seconds(10)))
      TROUPE_LOG(log_level::warn, "collectives", "communicator of group '", name_,
                 "' did not finalize; aborted it");
  }
}

expected<void> nccl_comm::async_status() const {
  if (state_.load() == state::aborted)
    return make_error(errc::aborted, "the communicator of group '", name_, "' was aborted");
  ncclResult_t async = ncclSuccess;
  auto r = ncclCommGetAsyncError(comm_, &async);
  if (r != ncclSuccess) return nccl_error(r, "ncclCommGetAsyncError", comm_);
  if (async != ncclSuccess && async != ncclInProgress)
    return nccl_error(async, "the communicator", comm_);
  return ok();
}

expected<void> nccl_comm::wait_ready(std::string_view call, duration timeout) const {
  auto dl = deadline::after(timeout);
  for (;;) {
    ncclResult_t async = ncclSuccess;
    auto r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) return nccl_error(r, "ncclCommGetAsyncError", comm_);
    if (async == ncclSuccess) return ok();
    if (async != ncclInProgress) return nccl_error(async, call, comm_);
    if (dl.expired())
      return make_error(errc::timeout, call, " on group '", name_, "' was still in progress after ",
                        format_duration(timeout));
    std::this_thread::sleep_for(poll_interval);
  }
}

expected<void> nccl_comm::check(ncclResult_t r, std::string_view call, duration timeout) const {
  if (r == ncclSuccess) return ok();
  if (r == ncclInProgress) return wait_ready(call, timeout);
  return nccl_error(r, call, comm_);
}

expected<void> nccl_comm::finalize(duration timeout) {
  auto expected_state = state::live;
  if (!state_.compare_exchange_strong(expected_state, state::finalized)) return ok();
  auto r = ncclCommFinalize(comm_);
  auto done = check(r, "ncclCommFinalize", timeout);
  if (!done) {
    (void)ncclCommAbort(comm_);
    state_.store(state::aborted);
    return done;
  }
  (void)ncclCommDestroy(comm_);
  return ok();
}

void nccl_comm::abort() noexcept {
  auto s = state_.exchange(state::aborted);
  if (s == state::live) (void)ncclCommAbort(comm_);
}

}  // namespace troupe::collectives
