#include <troupe/rpc/wire.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>

#include <troupe/core/hmac.hpp>
#include <troupe/rpc/detail/ipc_record.hpp>

namespace troupe::rpc::wire {

namespace {

template <class U>
void put(std::byte* p, U v) {
  std::memcpy(p, &v, sizeof(U));
}
template <class U>
U get(const std::byte* p) {
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
}
template <class U>
void append(bytes& out, U v) {
  std::byte tmp[sizeof(U)];
  std::memcpy(tmp, &v, sizeof(U));
  out.insert(out.end(), tmp, tmp + sizeof(U));
}

error proto(std::string msg) { return error(errc::protocol_error, std::move(msg)); }

// One descriptor: u8 dtype, u8 device type, i32 device index, u8 rank, i64 dims[rank],
// u64 nbytes.
constexpr std::size_t descriptor_fixed = 1 + 1 + 4 + 1 + 8;

}  // namespace

bool is_valid_kind(std::uint8_t raw) noexcept {
  return raw >= static_cast<std::uint8_t>(kind::handshake) &&
         raw <= static_cast<std::uint8_t>(kind::ipc_release);
}

std::string handshake_proof(std::string_view role, std::string_view token,
                            std::string_view caller_nonce, std::string_view acceptor_nonce,
                            std::string_view group, std::string_view caller) {
  auto b = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  // Lengths keep the fields apart ("ab"+"c" and "a"+"bc" hash differently).
  auto n = [](std::string_view s) {
    auto v = static_cast<std::uint32_t>(s.size());
    std::array<std::byte, 4> out{};
    for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(i)] = std::byte(v >> (8 * i));
    return out;
  };
  auto lg = n(group), lc = n(caller);
  static constexpr std::string_view domain = "troupe rpc handshake ";
  auto tag = hmac_sha256(
      token, {b(domain), b(role), b(caller_nonce), b(acceptor_nonce),
              std::span<const std::byte>(lg), b(group), std::span<const std::byte>(lc), b(caller)});
  return std::string(reinterpret_cast<const char*>(tag.data()), tag.size());
}

std::string_view to_string(kind k) noexcept {
  switch (k) {
    case kind::handshake:
      return "handshake";
    case kind::handshake_ok:
      return "handshake_ok";
    case kind::request:
      return "request";
    case kind::response:
      return "response";
    case kind::error:
      return "error";
    case kind::rref_fetch:
      return "rref_fetch";
    case kind::rref_add:
      return "rref_add";
    case kind::rref_release:
      return "rref_release";
    case kind::membership:
      return "membership";
    case kind::shutdown:
      return "shutdown";
    case kind::handshake_challenge:
      return "handshake_challenge";
    case kind::handshake_auth:
      return "handshake_auth";
    case kind::ipc_release:
      return "ipc_release";
  }
  return "unknown";
}

void write_header(const header& h, std::span<std::byte> out) {
  std::byte* p = out.data();
  put<std::uint32_t>(p, magic);
  put<std::uint8_t>(p + 4, version);
  put<std::uint8_t>(p + 5, static_cast<std::uint8_t>(h.type));
  put<std::uint16_t>(p + 6, h.flags);
  put<std::uint64_t>(p + 8, h.id);
  put<std::uint32_t>(p + 16, h.message_len);
  put<std::uint32_t>(p + 20, h.descriptors_len);
  put<std::uint32_t>(p + 24, h.tensor_count);
  put<std::uint32_t>(p + 28, 0);
  put<std::uint64_t>(p + 32, h.payload_len);
}

expected<header> read_header(std::span<const std::byte> in, const limits& lim) {
  if (in.size() < header_size)
    return proto(strcat("a frame header needs ", header_size, " bytes, got ", in.size()));
  const std::byte* p = in.data();
  if (get<std::uint32_t>(p) != magic)
    return proto(
        "the stream does not start with a troupe RPC frame (bad magic); "
        "is the peer a troupe RPC agent of this version?");
  auto v = get<std::uint8_t>(p + 4);
  if (v != version)
    return proto(strcat("wire version ", int(v), " is not supported (this build speaks version ",
                        int(version), "); run the same troupe version on every worker"));
  auto k = get<std::uint8_t>(p + 5);
  if (!is_valid_kind(k)) return proto(strcat("unknown frame kind ", int(k)));
  if (get<std::uint32_t>(p + 28) != 0) return proto("the reserved header field is not zero");
  header h;
  h.type = static_cast<kind>(k);
  h.flags = get<std::uint16_t>(p + 6);
  h.id = get<std::uint64_t>(p + 8);
  h.message_len = get<std::uint32_t>(p + 16);
  h.descriptors_len = get<std::uint32_t>(p + 20);
  h.tensor_count = get<std::uint32_t>(p + 24);
  h.payload_len = get<std::uint64_t>(p + 32);
  if (h.message_len > lim.max_message)
    return proto(
        strcat("a message of ", h.message_len, " bytes exceeds the limit of ", lim.max_message));
  if (h.tensor_count > lim.max_tensors)
    return proto(
        strcat("a frame with ", h.tensor_count, " tensors exceeds the limit of ", lim.max_tensors));
  if (h.payload_len > lim.max_payload)
    return proto(strcat("a tensor payload of ", h.payload_len, " bytes exceeds the limit of ",
                        lim.max_payload));
  std::uint64_t min_desc = std::uint64_t{h.tensor_count} * descriptor_fixed;
  std::uint64_t max_desc = std::uint64_t{h.tensor_count} * (descriptor_fixed + 8 * max_tensor_rank);
  if (h.descriptors_len < min_desc || h.descriptors_len > max_desc)
    return proto(strcat("descriptor section of ", h.descriptors_len, " bytes does not fit ",
                        h.tensor_count, " tensors"));
  if (h.tensor_count == 0 && h.payload_len != 0)
    return proto("a frame without tensors carries payload bytes");
  return h;
}

frame_builder::frame_builder(kind k, std::uint64_t id, std::uint16_t flags)
    : kind_(k), id_(id), flags_(flags) {
  head_.reserve(256);
  head_.resize(header_size);
}

expected<void> frame_builder::finish(const limits& lim) {
  header h;
  h.type = kind_;
  h.flags = flags_;
  h.id = id_;
  if (head_.size() - header_size > lim.max_message)
    return make_error(errc::invalid_argument, "the serialized arguments take ",
                      head_.size() - header_size, " bytes, over the limit of ", lim.max_message,
                      "; send large data as tensors");
  h.message_len = static_cast<std::uint32_t>(head_.size() - header_size);
  if (tensors_.size() > lim.max_tensors)
    return make_error(errc::invalid_argument, "a call carries ", tensors_.size(),
                      " tensors, over the limit of ", lim.max_tensors);
  std::size_t desc_start = head_.size();
  std::uint64_t payload = 0;
  for (const auto& t : tensors_) {
    if (!t.is_contiguous())
      return make_error(errc::internal, "tensor ", t,
                        " reached the frame builder without being packed into contiguous memory");
    if (t.shape().size() > max_tensor_rank)
      return make_error(errc::invalid_argument, "tensor ", t, " has rank ", t.shape().size(),
                        "; at most ", max_tensor_rank, " dimensions can be sent");
    head_.push_back(static_cast<std::byte>(t.type()));
    // Device type: 0 cpu, 1 cuda, 2 cuda through a CUDA IPC record (the bytes are the
    // record, rpc/device_helper.hpp).
    head_.push_back(static_cast<std::byte>(
        detail::is_ipc_record(t) ? std::uint8_t{2} : static_cast<std::uint8_t>(t.dev().type())));
    append<std::int32_t>(head_, t.dev().index());
    head_.push_back(static_cast<std::byte>(t.shape().size()));
    for (auto d : t.shape()) append<std::int64_t>(head_, d);
    append<std::uint64_t>(head_, t.nbytes());
    payload += t.nbytes();
  }
  if (payload > lim.max_payload)
    return make_error(errc::invalid_argument, "a call carries ", payload,
                      " tensor bytes, over the limit of ", lim.max_payload);
  h.descriptors_len = static_cast<std::uint32_t>(head_.size() - desc_start);
  h.tensor_count = static_cast<std::uint32_t>(tensors_.size());
  h.payload_len = payload;
  write_header(h, std::span(head_.data(), header_size));
  return ok();
}

std::size_t frame_builder::size() const noexcept {
  std::size_t n = head_.size();
  for (const auto& t : tensors_) n += t.nbytes();
  return n;
}

expected<void> frame_decoder::fail(error e) {
  failed_ = true;
  error_ = std::move(e);
  return error_;
}

expected<void> frame_decoder::start_body() {
  auto h = read_header(std::span<const std::byte>(head_buf_, header_size), lim_);
  if (!h) return fail(std::move(h).error());
  cur_ = *h;
  frame_ = frame{};
  frame_.type = cur_.type;
  frame_.flags = cur_.flags;
  frame_.id = cur_.id;
  body_.resize(std::size_t{cur_.message_len} + cur_.descriptors_len);
  body_have_ = 0;
  state_ = state::body;
  return ok();
}

expected<void> frame_decoder::parse_descriptors() {
  const std::byte* p = body_.data() + cur_.message_len;
  std::size_t left = cur_.descriptors_len;
  std::uint64_t total = 0;
  frame_.tensors.reserve(cur_.tensor_count);
  for (std::uint32_t i = 0; i < cur_.tensor_count; ++i) {
    if (left < descriptor_fixed) return fail(proto(strcat("descriptor ", i, " is truncated")));
    auto dt = get<std::uint8_t>(p);
    auto dev_type = get<std::uint8_t>(p + 1);
    auto dev_index = get<std::int32_t>(p + 2);
    auto rank = get<std::uint8_t>(p + 6);
    p += 7;
    left -= 7;
    if (!is_valid_dtype(dt))
      return fail(proto(strcat("descriptor ", i, ": unknown dtype ", int(dt))));
    device dev;
    if (dev_type == 1 || dev_type == 2) {
      auto d = device::cuda(dev_index);
      if (!d) return fail(proto(strcat("descriptor ", i, ": bad cuda index ", dev_index)));
      dev = *d;
    } else if (dev_type != 0) {
      return fail(proto(strcat("descriptor ", i, ": unknown device type ", int(dev_type))));
    }
    if (rank > max_tensor_rank || left < std::size_t{rank} * 8 + 8)
      return fail(proto(strcat("descriptor ", i, ": rank ", int(rank), " does not fit")));
    std::vector<std::int64_t> shape(rank);
    std::uint64_t numel = 1;
    for (auto& d : shape) {
      d = get<std::int64_t>(p);
      p += 8;
      if (d < 0) return fail(proto(strcat("descriptor ", i, ": negative dimension ", d)));
      auto ud = static_cast<std::uint64_t>(d);
      if (ud != 0 && numel > lim_.max_payload / ud)
        return fail(proto(strcat("descriptor ", i, ": shape is larger than the payload limit")));
      numel *= ud;
    }
    auto nbytes = get<std::uint64_t>(p);
    p += 8;
    left -= std::size_t{rank} * 8 + 8;
    auto dtype_v = static_cast<dtype>(dt);
    if (numel * element_size(dtype_v) != nbytes)
      return fail(proto(strcat("descriptor ", i, ": ", nbytes, " bytes do not match its shape")));
    total += nbytes;
    if (total > cur_.payload_len)
      return fail(
          proto(strcat("descriptors claim more than the ", cur_.payload_len, " payload bytes")));
    std::shared_ptr<std::byte> mem;
    try {
      if (dev_type == 2) {
        if (dtype_v != dtype::uint8)
          return fail(proto(strcat("descriptor ", i, ": a CUDA IPC record must be u8 bytes")));
        mem = detail::allocate_ipc_record(static_cast<std::size_t>(nbytes));
      }
      if (alloc_ != nullptr && dev_type == 1) mem = alloc_(dev, static_cast<std::size_t>(nbytes));
      if (!mem) mem = allocate_aligned(static_cast<std::size_t>(nbytes));
    } catch (const std::bad_alloc&) {
      return fail(error(errc::unavailable,
                        strcat("cannot allocate ", nbytes, " bytes for a received tensor")));
    }
    auto t = tensor::wrap(mem.get(), dtype_v, std::move(shape), dev, {},
                          std::shared_ptr<void>(mem, mem.get()));
    if (!t) return fail(proto(t.error().message()));
    frame_.tensors.push_back(std::move(*t));
  }
  if (left != 0) return fail(proto(strcat(left, " bytes left over after the tensor descriptors")));
  if (total != cur_.payload_len)
    return fail(proto(
        strcat("descriptors add up to ", total, " bytes but the header says ", cur_.payload_len)));
  body_.resize(cur_.message_len);
  frame_.message = std::move(body_);
  body_ = bytes{};
  tensor_index_ = 0;
  tensor_have_ = 0;
  state_ = state::payload;
  return ok();
}

void frame_decoder::next_tensor(std::vector<frame>& out) {
  while (tensor_index_ < frame_.tensors.size() &&
         tensor_have_ == frame_.tensors[tensor_index_].nbytes()) {
    ++tensor_index_;
    tensor_have_ = 0;
  }
  if (tensor_index_ == frame_.tensors.size()) {
    out.push_back(std::move(frame_));
    frame_ = frame{};
    state_ = state::head;
    head_have_ = 0;
  }
}

std::span<std::byte> frame_decoder::payload_window() noexcept {
  if (failed_ || state_ != state::payload || tensor_index_ >= frame_.tensors.size()) return {};
  auto& t = frame_.tensors[tensor_index_];
  return {static_cast<std::byte*>(t.data()) + tensor_have_, t.nbytes() - tensor_have_};
}

expected<void> frame_decoder::payload_written(std::size_t n, std::vector<frame>& out) {
  if (failed_) return error_;
  auto w = payload_window();
  if (n > w.size())
    return fail(error(errc::internal, "more payload bytes written than the window holds"));
  tensor_have_ += n;
  next_tensor(out);
  return ok();
}

expected<void> frame_decoder::feed(std::span<const std::byte> in, std::vector<frame>& out) {
  if (failed_) return error_;
  std::size_t pos = 0;
  while (pos < in.size()) {
    switch (state_) {
      case state::head: {
        std::size_t n = std::min(header_size - head_have_, in.size() - pos);
        std::memcpy(head_buf_ + head_have_, in.data() + pos, n);
        head_have_ += n;
        pos += n;
        if (head_have_ == header_size) {
          TROUPE_TRY(start_body());
          if (body_.empty()) {
            TROUPE_TRY(parse_descriptors());
            next_tensor(out);
          }
        }
        break;
      }
      case state::body: {
        std::size_t n = std::min(body_.size() - body_have_, in.size() - pos);
        std::memcpy(body_.data() + body_have_, in.data() + pos, n);
        body_have_ += n;
        pos += n;
        if (body_have_ == body_.size()) {
          TROUPE_TRY(parse_descriptors());
          next_tensor(out);
        }
        break;
      }
      case state::payload: {
        auto w = payload_window();
        std::size_t n = std::min(w.size(), in.size() - pos);
        std::memcpy(w.data(), in.data() + pos, n);
        pos += n;
        tensor_have_ += n;
        next_tensor(out);
        break;
      }
    }
  }
  return ok();
}

}  // namespace troupe::rpc::wire
