#include <troupe/rpc/detail/ipc_record.hpp>

#include <cstring>

#include <troupe/rpc/device_helper.hpp>

namespace troupe::rpc::detail {

namespace {

constexpr std::uint32_t record_magic = 0x43504954;  // "TIPC" as little-endian bytes
constexpr std::uint32_t record_version = 1;
constexpr std::size_t max_rank = 16;
constexpr std::uint64_t max_bytes = std::uint64_t{1} << 48;
constexpr std::size_t shape_at = 56, mem_handle_at = shape_at + 8 * max_rank,
                      event_handle_at = mem_handle_at + 64;
static_assert(event_handle_at + 64 + 8 == ipc_record_size);

// The deleter type is the mark: std::get_deleter finds it through any copy or alias of
// the owning pointer, so the mark travels with the tensor (with_device keeps its owner).
struct ipc_record_deleter {
  void operator()(std::byte* p) const noexcept { delete[] p; }
};

template <class U>
void put(std::byte* p, U v) {
  std::memcpy(p, &v, sizeof v);
}
template <class U>
U get(const std::byte* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::shared_ptr<std::byte> allocate_ipc_record(std::size_t n) {
  return std::shared_ptr<std::byte>(new std::byte[n](), ipc_record_deleter{});
}

bool is_ipc_record(const tensor& t) noexcept {
  return t.owner() != nullptr && std::get_deleter<ipc_record_deleter>(t.owner()) != nullptr;
}

std::size_t ipc_record::nbytes() const noexcept {
  std::size_t n = element_size(type);
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

expected<tensor> encode_ipc_record(const ipc_record& r, device target) {
  if (r.shape.size() > max_rank)
    return make_error(errc::invalid_argument, "a tensor of rank ", r.shape.size(),
                      " cannot be lent through CUDA IPC (at most ", max_rank, ")");
  auto mem = allocate_ipc_record(ipc_record_size);
  auto* p = mem.get();
  put<std::uint32_t>(p, record_magic);
  put<std::uint32_t>(p + 4, record_version);
  put<std::int32_t>(p + 8, r.pid);
  put<std::int32_t>(p + 12, r.source_device);
  put<std::uint64_t>(p + 16, r.loan_id);
  put<std::uint64_t>(p + 24, r.offset);
  put<std::uint64_t>(p + 32, r.base);
  put<std::uint64_t>(p + 40, r.event);
  put<std::uint8_t>(p + 48, static_cast<std::uint8_t>(r.type));
  put<std::uint8_t>(p + 49, static_cast<std::uint8_t>(r.shape.size()));
  for (std::size_t i = 0; i < r.shape.size(); ++i)
    put<std::int64_t>(p + shape_at + 8 * i, r.shape[i]);
  std::memcpy(p + mem_handle_at, r.mem_handle.data(), 64);
  std::memcpy(p + event_handle_at, r.event_handle.data(), 64);
  return tensor::wrap(p, dtype::uint8, {static_cast<std::int64_t>(ipc_record_size)}, target, {},
                      std::shared_ptr<void>(std::move(mem)));
}

expected<ipc_record> decode_ipc_record(const tensor& t) {
  auto bad = [](auto&&... what) {
    return make_error(errc::protocol_error, "malformed CUDA IPC record: ", what...);
  };
  if (t.type() != dtype::uint8 || t.nbytes() != ipc_record_size || t.data() == nullptr)
    return bad(t.nbytes(), " bytes of ", to_string(t.type()), " instead of ", ipc_record_size,
               " bytes");
  const auto* p = static_cast<const std::byte*>(t.data());
  if (get<std::uint32_t>(p) != record_magic) return bad("wrong magic");
  if (auto v = get<std::uint32_t>(p + 4); v != record_version)
    return bad("version ", v, " (this build reads version ", record_version, ")");
  ipc_record r;
  r.pid = get<std::int32_t>(p + 8);
  r.source_device = get<std::int32_t>(p + 12);
  r.loan_id = get<std::uint64_t>(p + 16);
  r.offset = get<std::uint64_t>(p + 24);
  r.base = get<std::uint64_t>(p + 32);
  r.event = get<std::uint64_t>(p + 40);
  const auto dt = get<std::uint8_t>(p + 48);
  if (!is_valid_dtype(dt)) return bad("unknown dtype ", int(dt));
  r.type = static_cast<dtype>(dt);
  const auto rank = get<std::uint8_t>(p + 49);
  if (rank > max_rank) return bad("rank ", int(rank), " over ", max_rank);
  if (r.loan_id == 0) return bad("loan id 0");
  if (r.source_device < 0) return bad("negative device index ", r.source_device);
  std::uint64_t n = element_size(r.type);
  for (std::size_t i = 0; i < rank; ++i) {
    auto d = get<std::int64_t>(p + shape_at + 8 * i);
    if (d < 0) return bad("negative dimension ", d);
    if (d != 0 && n > max_bytes / static_cast<std::uint64_t>(d))
      return bad("a shape over 2^48 bytes");
    n *= static_cast<std::uint64_t>(d);
    r.shape.push_back(d);
  }
  std::memcpy(r.mem_handle.data(), p + mem_handle_at, 64);
  std::memcpy(r.event_handle.data(), p + event_handle_at, 64);
  return r;
}

}  // namespace troupe::rpc::detail

namespace troupe::rpc {

// Declared in rpc/device_helper.hpp; host-only, so that a build without CUDA can release a
// record it received.
std::uint64_t ipc_record_loan_id(const tensor& record) noexcept {
  auto r = detail::decode_ipc_record(record);
  return r ? r->loan_id : 0;
}

}  // namespace troupe::rpc
