// The RPC wire format (docs/rpc-wire.md): fixed 40-byte header, then the message bytes,
// then one descriptor per tensor, then the tensors' bytes back to back. The frame_decoder
// turns a byte stream into frames and refuses anything malformed, truncated or oversized
// with errc::protocol_error; it never reads past its input or allocates more than the
// limits allow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>

namespace troupe::rpc::wire {

inline constexpr std::uint32_t magic = 0x43505254;  // "TRPC" as little-endian bytes
/// 2: the job token is proven with HMAC-SHA256 over both sides' nonces, never sent.
/// 3: GPU tensors between workers on one host may travel as CUDA IPC records (device
///    type 2, released by kind::ipc_release).
/// 4: member records carry the membership tag (rpc_backend_options::membership_tag).
inline constexpr std::uint8_t version = 4;
inline constexpr std::size_t header_size = 40;
inline constexpr std::size_t max_tensor_rank = 16;

/// Frame kinds. Stable values: they travel on the wire.
enum class kind : std::uint8_t {
  /// First frame of a connection: protocol version, the caller's nonce and identity.
  handshake = 1,
  /// The acceptor's answer once the caller has proven the job token: its identity.
  handshake_ok = 2,
  /// A call: function name, call flags, timeout, then the serialized arguments.
  request = 3,
  /// The successful result of the request with the same id.
  response = 4,
  /// The failure of the request with the same id (a serialized troupe::error); with id 0
  /// it refuses a handshake or reports a fatal protocol error before closing.
  error = 5,
  /// Fetch the value of a remote reference owned by the receiver (answered by response).
  rref_fetch = 6,
  /// Add holders to a remote reference owned by the receiver (answered by response).
  rref_add = 7,
  /// Drop one holder of a remote reference owned by the receiver (no answer).
  rref_release = 8,
  /// A worker joins or leaves a dynamic group (answered by response).
  membership = 9,
  /// The sender is shutting down in an orderly way; no answer.
  shutdown = 10,
  /// The acceptor's answer to a handshake: its nonce and its proof of the job token.
  handshake_challenge = 11,
  /// The caller's proof of the job token, answering the challenge.
  handshake_auth = 12,
  /// The receiver of a GPU tensor lent through CUDA IPC has copied it: the sender may drop
  /// the loan whose id is the frame's id. Either direction of a connection; no answer.
  ipc_release = 13,
};

/// The proof that `role` ("acceptor" or "caller") knows `token`: HMAC-SHA256 over the
/// role, both nonces, the group and the caller's name, so that a proof opens one
/// connection, in one direction, for one caller only.
std::string handshake_proof(std::string_view role, std::string_view token,
                            std::string_view caller_nonce, std::string_view acceptor_nonce,
                            std::string_view group, std::string_view caller);

/// True for a value that names a kind.
bool is_valid_kind(std::uint8_t raw) noexcept;
std::string_view to_string(kind k) noexcept;

struct limits {
  /// Largest message section (serialized arguments without tensors).
  std::size_t max_message = std::size_t{256} << 20;
  /// Largest total of tensor bytes in one frame.
  std::uint64_t max_payload = std::uint64_t{16} << 30;
  /// Most tensors in one frame.
  std::uint32_t max_tensors = 4096;
};

struct header {
  kind type = kind::request;
  std::uint16_t flags = 0;
  std::uint64_t id = 0;
  std::uint32_t message_len = 0;
  std::uint32_t descriptors_len = 0;
  std::uint32_t tensor_count = 0;
  std::uint64_t payload_len = 0;
};

/// Writes `h` into the first header_size bytes of `out` (which must be that long).
void write_header(const header& h, std::span<std::byte> out);
/// Reads and checks a header: magic, version, kind, reserved bytes, limits.
expected<header> read_header(std::span<const std::byte> in, const limits& lim);

/// A complete received frame.
struct frame {
  kind type = kind::request;
  std::uint16_t flags = 0;
  std::uint64_t id = 0;
  /// The message section.
  bytes message;
  /// The tensors, each owning its received bytes (64-byte aligned).
  std::vector<tensor> tensors;
};

/// Builds an outgoing frame: reserve the header, append the message, then `finish` adds
/// the tensor descriptors and fills in the header. `buffers()` are what to write, in order
/// (the head, then each tensor's bytes straight from its memory).
class frame_builder {
 public:
  frame_builder(kind k, std::uint64_t id, std::uint16_t flags = 0);
  /// Where the message bytes go; append to it.
  bytes& message() noexcept { return head_; }
  /// The tensors that travel with the frame; serializers append to it.
  std::vector<tensor>& tensors() noexcept { return tensors_; }
  /// Appends the descriptors and writes the header. Each tensor's bytes must be contiguous
  /// host memory; its dev() is the device it lands on at the receiver (prepare_outgoing in
  /// rpc/routing.hpp does both). Fails for a strided tensor or a frame over `lim`.
  expected<void> finish(const limits& lim = {});
  /// Total bytes on the wire (valid after finish).
  std::size_t size() const noexcept;
  const bytes& head() const noexcept { return head_; }
  std::uint64_t id() const noexcept { return id_; }
  const std::vector<tensor>& payload() const noexcept { return tensors_; }

 private:
  bytes head_;
  std::vector<tensor> tensors_;
  kind kind_;
  std::uint64_t id_;
  std::uint16_t flags_;
};

/// Where a received tensor's bytes land: memory of at least `bytes` bytes for a tensor
/// bound for `dev` (its descriptor's device), or null to take allocate_aligned's. The
/// agent gives page-locked memory for tensors bound for a GPU (device_helper.hpp), so
/// that their upload is one DMA copy instead of a copy through the driver's own buffers.
using receive_allocator = std::shared_ptr<std::byte> (*)(device dev, std::size_t bytes);

/// Incremental decoder of a byte stream into frames. After its first error it stays
/// failed and returns that error again.
class frame_decoder {
 public:
  explicit frame_decoder(limits lim = {}, receive_allocator alloc = nullptr)
      : lim_(lim), alloc_(alloc) {}

  /// Consumes all of `in`, appending each completed frame to `out`.
  expected<void> feed(std::span<const std::byte> in, std::vector<frame>& out);

  /// While a frame's tensor bytes are being received: the rest of the current tensor's
  /// memory, so a reader can receive into it directly. Empty otherwise.
  std::span<std::byte> payload_window() noexcept;
  /// Reports that `n` bytes were written into payload_window().
  expected<void> payload_written(std::size_t n, std::vector<frame>& out);

  bool failed() const noexcept { return failed_; }

 private:
  enum class state { head, body, payload };
  expected<void> fail(error e);
  expected<void> start_body();
  expected<void> parse_descriptors();
  void next_tensor(std::vector<frame>& out);

  limits lim_;
  receive_allocator alloc_ = nullptr;
  state state_ = state::head;
  std::byte head_buf_[header_size]{};
  std::size_t head_have_ = 0;
  header cur_;
  bytes body_;
  std::size_t body_have_ = 0;
  frame frame_;
  std::size_t tensor_index_ = 0;
  std::size_t tensor_have_ = 0;
  bool failed_ = false;
  error error_;
};

}  // namespace troupe::rpc::wire
