#include <troupe/collectives/nccl/nccl_comm.hpp>

#include <dlfcn.h>

#include <thread>

#include <troupe/collectives/comm_plan.hpp>
#include <troupe/collectives/nccl/nccl_errors.hpp>
#include <troupe/core/log.hpp>

namespace troupe::collectives {

namespace {
constexpr auto poll_interval = std::chrono::microseconds(200);

// ncclCommShrink, found at run time so that this library still loads with an NCCL older
// than the headers it was built with (2.27 added the call).
using shrink_fn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
shrink_fn find_shrink() noexcept {
  static const shrink_fn f = [] {
    if (!shrink_supported(nccl_comm::library_version())) return shrink_fn(nullptr);
    return reinterpret_cast<shrink_fn>(dlsym(RTLD_DEFAULT, "ncclCommShrink"));
  }();
  return f;
}
}  // namespace

int nccl_shrink_flags(bool abort_first) noexcept {
  return abort_first ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
}

int nccl_comm::library_version() noexcept {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
}

bool nccl_comm::can_shrink() noexcept { return find_shrink() != nullptr; }

ncclConfig_t nccl_comm::config(const std::string& name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name.c_str();
  return c;
}

expected<std::unique_ptr<nccl_comm>> nccl_comm::init(int nranks, const ncclUniqueId& id, int rank,
                                                     const std::string& name, duration timeout) {
  // The object (and so its name, which NCCL keeps as the comm's commName) exists first.
  std::unique_ptr<nccl_comm> comm(new nccl_comm(nullptr, name));
  auto cfg = config(comm->name_);
  auto r = ncclCommInitRankConfig(&comm->comm_, nranks, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    comm->abort();
    return nccl_error(r, "ncclCommInitRankConfig");
  }
  if (auto ready = comm->wait_ready("ncclCommInitRankConfig", timeout); !ready) {
    comm->abort();
    return make_error(ready.error().code(), "joining the communicator of group '", name,
                      "' as rank ", rank, " of ", nranks, ": ", ready.error().message());
  }
  return comm;
}

expected<ncclComm_t> nccl_comm::await_child(std::unique_ptr<ncclComm_t>& slot, ncclResult_t r,
                                            std::string_view call, duration timeout) const {
  if (r != ncclSuccess && r != ncclInProgress) return nccl_error(r, call, comm_);
  // This communicator stays ncclInProgress until NCCL's thread has created the child and
  // written its handle into *slot.
  if (auto done = wait_ready(call, timeout); !done) {
    // NCCL may still write into the slot: it must outlive us. 8 bytes, on a failure path.
    (void)slot.release();
    return std::move(done).error();
  }
  return __atomic_load_n(slot.get(), __ATOMIC_ACQUIRE);
}

expected<std::unique_ptr<nccl_comm>> nccl_comm::split(int color, int key, const std::string& name,
                                                      duration timeout) {
  std::unique_ptr<nccl_comm> out(new nccl_comm(nullptr, name));
  auto cfg = config(out->name_);
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  auto r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot.get(), &cfg);
  auto child = await_child(slot, r, "ncclCommSplit", timeout);
  if (!child) return std::move(child).error();
  if (color < 0 || *child == nullptr) return std::unique_ptr<nccl_comm>();
  out->comm_ = *child;
  if (auto ready = out->wait_ready("ncclCommSplit", timeout); !ready) {
    out->abort();
    return std::move(ready).error();
  }
  return out;
}

expected<std::unique_ptr<nccl_comm>> nccl_comm::shrink(const std::vector<int>& excluded,
                                                       bool abort_first, const std::string& name,
                                                       duration timeout) {
  auto fn = find_shrink();
  if (fn == nullptr)
    return make_error(errc::unavailable,
                      "ncclCommShrink is not available: the NCCL library in "
                      "this process is ",
                      format_nccl_version(library_version()),
                      " and the call needs 2.27 or newer; re-create the communicator instead");
  if (state_.load() != state::live)
    return make_error(errc::invalid_argument, "shrinking the communicator of group '", name_,
                      "': it was already aborted or destroyed");
  std::vector<int> list = excluded;
  std::unique_ptr<nccl_comm> out(new nccl_comm(nullptr, name));
  auto cfg = config(out->name_);
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  auto r = fn(comm_, list.empty() ? nullptr : list.data(), static_cast<int>(list.size()),
              slot.get(), &cfg, nccl_shrink_flags(abort_first));
  auto child = await_child(slot, r, "ncclCommShrink", timeout);
  if (!child)
    return make_error(child.error().code(), "shrinking the communicator of group '", name_,
                      "' into '", name, "': ", child.error().message());
  if (*child == nullptr)
    return make_error(errc::internal, "ncclCommShrink of group '", name_,
                      "' returned no communicator");
  out->comm_ = *child;
  if (auto ready = out->wait_ready("ncclCommShrink", timeout); !ready) {
    out->abort();
    return make_error(ready.error().code(), "shrinking the communicator of group '", name_,
                      "' into '", name, "' (excluding ", excluded.size(),
                      " rank(s)): ", ready.error().message());
  }
  return out;
}

nccl_comm::~nccl_comm() {
  if (comm_ != nullptr && state_.load() == state::live) {
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
  if (comm_ == nullptr) return ok();
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
  if (s == state::live && comm_ != nullptr) (void)ncclCommAbort(comm_);
}

}  // namespace troupe::collectives
