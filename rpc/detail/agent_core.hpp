// agent_core: the shared state behind an rpc::agent (docs/rpc.md, "Threading model").
//
// - I/O threads run the sockets; each connection is on its own strand. Frames are decoded
//   there; responses complete their caller's future there (continuations attached to RPC
//   futures run on an I/O thread: keep them short).
// - User functions run on the worker pool, unless registered with run_inline.
// - Each concern owns its state under one lock: the sockets, I/O threads and the table of
//   connections are the transport's (transport.hpp); membership (peers, reverse maps,
//   device list) is members_ (member_view.hpp); remote references this worker owns are
//   rrefs_ (rref_table.hpp), with no I/O inside. What remains here is the dispatch of
//   frames (dispatch.cpp), calls (calls.cpp), group formation (membership.cpp) and the
//   lifecycle. No lock is held while calling user code, completing a promise, or waiting
//   on the network.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/future.hpp>
#include <troupe/devicemap/derive.hpp>
#include <troupe/rpc/detail/connection.hpp>
#include <troupe/rpc/detail/loan_book.hpp>
#include <troupe/rpc/detail/member_view.hpp>
#include <troupe/rpc/detail/rref_table.hpp>
#include <troupe/rpc/detail/spin_policy.hpp>
#include <troupe/rpc/detail/transport.hpp>
#include <troupe/rpc/detail/worker_pool.hpp>
#include <troupe/rpc/function_table.hpp>
#include <troupe/rpc/membership_event.hpp>
#include <troupe/rpc/options.hpp>
#include <troupe/rpc/remote_ref.hpp>
#include <troupe/rpc/worker_ref.hpp>
#include <troupe/store/store.hpp>

namespace troupe::rpc::detail {

/// Flags of a request.
inline constexpr std::uint8_t request_as_remote = 1;
/// A one-way call (agent::notify): the callee sends no response, errors are logged there.
inline constexpr std::uint8_t request_no_reply = 2;
/// Built-in function answered by the agent itself (warm-up round).
inline constexpr std::string_view ping_function = "troupe.ping";

/// The id of the trace flow arrow from call `call` of worker `caller` to its server span:
/// both sides know the pair (the caller's id from the handshake, the call id from the
/// frame header), so nothing extra travels.
std::uint64_t call_flow_id(std::int32_t caller, std::uint64_t call) noexcept;

class agent_core final : public connection_owner,
                         public rref_context,
                         public std::enable_shared_from_this<agent_core> {
 public:
  /// Starts an agent and joins it to its group (static when world_size is given, else
  /// dynamic). On failure nothing is left running.
  static expected<std::shared_ptr<agent_core>> create(std::string name, int rank,
                                                      std::optional<int> world_size,
                                                      rpc_backend_options opts);
  ~agent_core() override;

  worker_info self() const { return self_; }
  bool dynamic() const noexcept { return !world_size_; }
  std::vector<worker_info> workers() const;
  expected<worker_info> find(const worker_ref& w) const;
  function_table& functions() { return *functions_; }
  device_setup setup() const;
  const rpc_backend_options& options() const noexcept { return opts_; }
  /// rpc_sync callers' spinning for replies (options' busy_poll).
  spin_policy& reply_spin() noexcept { return reply_spin_; }
  duration timeout_of(const call_options& o) const {
    return o.timeout > duration::zero() ? o.timeout : opts_.rpc_timeout;
  }

  /// A request frame with its header part written; append the arguments.
  wire::frame_builder begin_request(std::string_view fn, std::uint8_t flags, std::uint64_t rref_id,
                                    duration timeout);
  /// Routes the tensors, finishes and sends; the future completes with the reply frame, or
  /// (expect_reply false, for one-way calls) with an empty frame once the request is queued
  /// on the connection. A request is always written at once (write_mode::now, after what
  /// was queued before it); `mode` applies to one-way calls. A full send queue blocks the
  /// caller until `timeout` (connection::send).
  /// With tracing on and `fn` given, the call is recorded as a client span (docs/tracing.md).
  future<wire::frame> send_request(const worker_info& to, wire::frame_builder&& fb,
                                   duration timeout, bool expect_reply = true,
                                   write_mode mode = write_mode::now, std::string_view fn = {});
  /// Estimates this process's clock offset against worker `to` with `samples` pings (each
  /// answered with the peer's clock) and records it in the trace (core/trace.hpp): the
  /// sample with the shortest round trip wins, its half round trip is the uncertainty.
  expected<void> record_clock_offset(const worker_info& to, int samples, deadline d);
  /// A fresh remote-reference id, unique in the group.
  std::uint64_t next_rref_id();
  /// Asks `owner` for the value of remote reference `id`.
  future<wire::frame> fetch_rref(const worker_info& owner, std::uint64_t id, duration timeout);
  /// Drops share `fork` of `id` at `owner` (fire and forget).
  void release_rref(const worker_info& owner, std::uint64_t id, std::uint64_t fork);
  /// Tells `owner` that share `fork` of `id` now belongs to worker `holder` (fire and
  /// forget; on the same connection as this process's own release, so it arrives first).
  void add_rref_share(const worker_info& owner, std::uint64_t id, std::uint64_t fork,
                      const std::string& holder);
  /// Remote references this worker owns (for tests and diagnostics).
  std::size_t owned_rrefs() const;
  /// True when this worker has a connection to `w` (adds and releases go on it).
  bool connected_to(const std::string& w) const;

  // rref_context: decoding only (replies, fetched values); sending needs a message_refs.
  expected<std::uint64_t> fork_rref(const std::shared_ptr<rref_holder>& h) override;
  expected<std::shared_ptr<rref_holder>> adopt_rref(const worker_info& owner, std::uint64_t id,
                                                    std::uint64_t fork) override;

  /// Membership listeners (rpc/membership_event.hpp). add returns an id for remove.
  std::uint64_t add_membership_listener(membership_listener l);
  void remove_membership_listener(std::uint64_t id);

  /// Dynamic groups: leaves everywhere, then stops. Static groups: unsupported.
  expected<void> leave(duration timeout);
  /// See agent::expel.
  bool expel(const std::string& name, std::string_view tag, const error& why);
  /// Graceful stop (see agent::shutdown). Idempotent.
  expected<void> shutdown(duration timeout);

  // connection_owner
  void on_frame(const std::shared_ptr<connection>& c, wire::frame&& f) override;
  void on_closed(const std::shared_ptr<connection>& c, const error& why) override;

 private:
  agent_core(std::string name, int rank, std::optional<int> world_size, rpc_backend_options opts);

  // Lifecycle (agent_core.cpp).
  expected<void> start_io();
  void start_sweeper();
  // The connection this worker opened to `m`, dialed when there is none.
  expected<std::shared_ptr<connection>> connection_to(const member& m, deadline d);
  // A new connection to `m` (not kept in the table).
  expected<std::shared_ptr<connection>> dial(const member& m, deadline d);
  // The caller's side of the handshake over a connected socket.
  expected<std::shared_ptr<connection>> handshake(const member& m, connection::socket_type sock,
                                                  std::unique_ptr<tls::session> tls, deadline d);
  transport::handshake_fn handshake_with(const member& m);
  expected<void> wait_outstanding(deadline d);
  void stop_local(const error& why);
  void send_shutdown_notices();
  // Waits until every connection has read its peer's shutdown notice (and so everything
  // the peer sent before it) or has failed, or `d` passes.
  void await_shutdown_notices(deadline d);

  // Group formation (membership.cpp).
  expected<void> init_static(deadline d);
  expected<void> init_dynamic(deadline d);
  expected<void> warm_up(deadline d);
  expected<void> ensure_token(deadline d);
  member my_record() const;
  void handle_membership(const std::shared_ptr<connection>& c, wire::frame&& f);
  expected<void> announce(const member& who, std::uint8_t op, const std::vector<member>& to,
                          deadline d);

  // Frames (dispatch.cpp).
  void handle_handshake(const std::shared_ptr<connection>& c, wire::frame&& f);
  void handle_handshake_auth(const std::shared_ptr<connection>& c, wire::frame&& f);
  void refuse_handshake(const std::shared_ptr<connection>& c, const error& why);
  void handle_request(const std::shared_ptr<connection>& c, wire::frame&& f);
  void run_request(const std::shared_ptr<connection>& c,
                   std::shared_ptr<const function_table::entry> fn, call_info info,
                   std::uint64_t id, std::uint8_t flags, std::uint64_t rref_id, deadline d,
                   wire::frame&& f, std::size_t args_offset);
  void handle_response(const std::shared_ptr<connection>& c, wire::frame&& f);
  void handle_rref(const std::shared_ptr<connection>& c, wire::frame&& f);
  void reply_error(const std::shared_ptr<connection>& c, std::uint64_t id, error e);
  void store_rref_value(std::uint64_t id, expected<wire::frame> value);
  using rref_waiter = rref_table::waiter;
  // Answers fetch `w` of reference `id` with `value` (or its error) and records its
  // "serve rref fetch" span when tracing.
  void answer_fetch(const rref_waiter& w, std::uint64_t id, const expected<wire::frame>& value);
  // Frees the shares held by `worker` (it died or left); never called with a lock held.
  void drop_rref_shares_of(const std::string& worker);

  // Tells every listener about `e`; never called with a lock held.
  void notify_membership(const membership_event& e);

  std::mutex listeners_mu_;
  std::map<std::uint64_t, membership_listener> listeners_;
  std::uint64_t next_listener_ = 1;

  const std::string name_;
  const int rank_;
  const std::optional<int> world_size_;
  rpc_backend_options opts_;
  spin_policy reply_spin_{opts_.busy_poll};
  worker_info self_;
  future<wire::frame> send_request_now(const worker_info& to, wire::frame_builder&& fb,
                                       duration timeout, bool expect_reply, write_mode mode);
  std::shared_ptr<function_table> functions_;
  std::shared_ptr<store> store_;
  int device_count_ = 0;
  std::string token_;
  // The sockets, I/O threads and connections (transport.hpp); made by create(), so null
  // only while it runs. Declared before the sweeper, whose timer runs on its I/O context.
  std::unique_ptr<transport> transport_;
  std::optional<asio::steady_timer> sweeper_;
  std::shared_ptr<std::function<void()>> sweep_loop_;
  std::unique_ptr<worker_pool> pool_;

  // Membership: this worker's view of its group (rpc/detail/member_view.hpp).
  member_view members_;

  // Remote references owned here (rpc/detail/rref_table.hpp).
  rref_table rrefs_;
  // Answers not_found to the waiters of parked entries older than rpc_timeout and drops them.
  void expire_parked_fetches(clock::time_point now);

  // This agent's share of the process-wide send-queue gauge (troupe_rpc_send_queue_bytes):
  // the sum of its connections' queued bytes at the sweeper's last tick.
  std::atomic<std::int64_t> send_queue_sample_{0};
  // Sets this agent's share to `queued` (sweeper only).
  void sample_send_queue(std::int64_t queued);

  std::atomic<std::uint64_t> next_call_{1};
  std::atomic<std::uint64_t> next_rref_{1};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> leaving_{false};
  std::mutex lifecycle_mu_;
  bool stopped_ = false;
  std::optional<error> stop_result_;

  // GPU tensors lent through CUDA IPC to workers on this host, until released.
  loan_book loans_{std::max<duration>(2 * opts_.rpc_timeout, std::chrono::seconds(30))};
  // The lender for tensors bound for `peer`: null (stage them) unless cuda_ipc is on and
  // the peer shares this worker's host key.
  ipc_lender* lender_for(const std::string& peer);
  // Releases loan `id` on a worker thread (dropping it may free user memory).
  void release_loan(std::uint64_t id);
  // A function for place_incoming that tells `c`'s peer a loan is released.
  static std::function<void(std::uint64_t)> releaser(const std::shared_ptr<connection>& c);
  // The reverse device map for results going back to `caller`; null when there is none.
  std::optional<device_map> reverse_map_for(const std::string& caller) const;
};

/// The remote references of one outgoing message (request or reply) and their receiver.
/// Serializing a reference forks a share for the receiver; commit() tells each owner
/// (rref_add) and must run before the message is sent. The holders stay alive here until
/// then, so the sender's own share outlives the announcement. Not committed (the message
/// was not sent): nothing is announced. An empty receiver refuses to fork (a value kept
/// as a remote value has no single receiver).
class message_refs final : public rref_context {
 public:
  message_refs(agent_core& core, std::string receiver)
      : core_(core), receiver_(std::move(receiver)) {}
  expected<std::uint64_t> fork_rref(const std::shared_ptr<rref_holder>& h) override;
  expected<std::shared_ptr<rref_holder>> adopt_rref(const worker_info& owner, std::uint64_t id,
                                                    std::uint64_t fork) override {
    return core_.adopt_rref(owner, id, fork);
  }
  /// Announces every fork to its owner. Idempotent.
  void commit();

 private:
  agent_core& core_;
  std::string receiver_;
  std::vector<std::pair<std::shared_ptr<rref_holder>, std::uint64_t>> forks_;
};

}  // namespace troupe::rpc::detail
