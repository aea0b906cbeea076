#include <troupe/rpc/device_helper.hpp>

namespace troupe::rpc {

namespace {
error no_cuda(const tensor& t, device d) {
  return make_error(errc::unavailable, "cannot move ", t, " to or from ", d,
                    ": this troupe was built without CUDA; rebuild with -DTROUPE_WITH_CUDA=ON "
                    "or keep the tensor (and its device map) on the CPU");
}
}  // namespace

bool gpu_copies_available() noexcept { return false; }

expected<tensor> stage_to_host(const tensor& t) { return no_cuda(t, t.dev()); }

expected<tensor> upload_to_device(const tensor& t, device target) { return no_cuda(t, target); }

expected<ipc_loan> lend_through_ipc(const tensor& t, device target, std::uint64_t) {
  return make_error(errc::unsupported, no_cuda(t, target).message());
}

std::shared_ptr<std::byte> receive_buffer(device, std::size_t) noexcept { return nullptr; }

expected<tensor> receive_through_ipc(const tensor& record) { return no_cuda(record, record.dev()); }

}  // namespace troupe::rpc
