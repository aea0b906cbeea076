// Options of an RPC agent, and of each call.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <troupe/core/device.hpp>
#include <troupe/core/time.hpp>
#include <troupe/core/tls.hpp>
#include <troupe/devicemap/device_map.hpp>
#include <troupe/rpc/wire.hpp>

namespace troupe {
class store;
}

namespace troupe::rpc {

class function_table;

struct rpc_backend_options {
  /// The timeout of a call that gives none: TROUPE_DEFAULT_TIMEOUT's (5 minutes unless set).
  duration rpc_timeout = default_timeout();
  /// The store to meet through, as a URL for connect_store ("tcp://host:port",
  /// "memory://name", "etcd://..."). Ignored when `store` is set.
  std::string init_method;
  /// A store object to use instead of opening `init_method`; it must outlive the agent.
  std::shared_ptr<troupe::store> store;
  /// Threads that run user functions.
  std::size_t num_worker_threads = 4;
  /// Threads that run the sockets (each connection is on one strand).
  std::size_t num_io_threads = 1;
  /// This worker's device maps, keyed by the target worker's name.
  troupe::device_maps device_maps;
  /// The devices this worker uses; empty: derived from the maps (see devicemap/derive.hpp).
  std::vector<device> devices;
  /// The number of CUDA devices to report; -1 asks the CUDA runtime (0 without one).
  int device_count = -1;
  /// Secret every connection must present. Empty: the first worker generates one and
  /// shares it through the store, so only processes that can read the store may connect.
  std::string job_token;
  /// Address the agent listens on and advertises to the other workers; port 0 picks a
  /// free one. Empty (the default): this process's address for its job
  /// (core/net_address.hpp local_address(): TROUPE_LOCAL_ADDR, which troupe-run sets;
  /// TROUPE_SOCKET_IFNAME's interface; 127.0.0.1 when every rank runs on this host; else
  /// the host name's address). "0.0.0.0" listens on every interface and advertises that
  /// address. A loopback address in a group across hosts fails init with a message naming
  /// what to set.
  std::string listen_host;
  std::uint16_t listen_port = 0;
  /// When listening on a loopback address, also accept on a local (Unix domain) socket in
  /// the abstract namespace named after that address, and reach peers on this host through
  /// theirs: the same frames and handshake over a cheaper kernel path (docs/rpc.md).
  /// Either side may turn it off; a peer without one is reached over TCP.
  bool local_socket = true;
  /// GPU tensors sent to a GPU of a worker on this host (same host_key) go through CUDA
  /// IPC: the receiver copies device to device from this worker's memory, which stays lent
  /// until it has (docs/rpc.md, "GPU tensors"). Off, or for memory IPC cannot share, they
  /// are staged through pinned host memory and the socket. One-way calls always stage.
  bool cuda_ipc = true;
  /// Mutual TLS for the agent's TCP connections (docs/security.md, "TLS between hosts"):
  /// this worker's certificate and key and the job's CA, PEM files. Every worker of the
  /// group must use TLS or none: a TLS worker refuses plain peers and peers whose
  /// certificate the CA did not sign. Local sockets (same host) stay plain. All empty (the
  /// default): TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA; none set there either: no
  /// TLS. A file that is missing or unreadable fails init naming it.
  tls::config tls;
  /// Key prefix in the store, so several groups can share one store.
  std::string group = "troupe/rpc";
  /// Who decides a dynamic group's membership. Empty (the default): the agent itself, as
  /// workers join, leave and lose their connections. Set: the job's membership decides
  /// (troupe::init's elastic world sets it to this worker's incarnation there; see
  /// docs/membership.md): a member whose connection breaks stays a member, and listeners
  /// hear `unreachable`, until agent::expel() takes it out. The string is this worker's
  /// tag, kept with its record, which expel() matches so that a replacement under the same
  /// name is never taken out for its predecessor.
  std::string membership_tag;
  /// Bound on init (store exchange, connections, barrier, warm-up): TROUPE_DEFAULT_TIMEOUT's
  /// (5 minutes unless set).
  duration init_timeout = default_timeout();
  /// Bound on a graceful shutdown.
  duration shutdown_timeout = std::chrono::seconds(30);
  /// Up to how long an rpc_sync caller spins for its reply, and a worker thread that ran
  /// out of work spins for the next call, before sleeping. Each spins only while its recent
  /// waits were short (at most four times this on a moving average), and one worker thread at a
  /// time: short calls in a row skip two thread wake-ups each, while an idle agent, slow
  /// functions or sparse calls cost no CPU. Zero: never spin.
  std::chrono::microseconds busy_poll{50};
  /// Bytes that may wait in one connection's send queue; a caller that finds it full
  /// blocks until there is room or its call's timeout passes (errc::timeout). I/O threads
  /// never block (answers and inline functions may exceed it, up to twice it: past that
  /// the peer, which does not read, is dropped). Zero: 64 MiB.
  std::size_t max_queued_bytes = std::size_t{64} << 20;
  /// Frame limits for authenticated peers.
  wire::limits limits;
  /// The functions this worker serves; a fresh table when null. More can be added later
  /// through agent::functions().
  std::shared_ptr<function_table> functions;
};

/// Options of one call.
struct call_options {
  /// Zero: the agent's rpc_timeout.
  duration timeout = duration::zero();
  /// One-way calls (agent::notify) only: true queues the frame and lets the connection's
  /// I/O strand write it together with every frame queued until then (one gathered write
  /// for a stream of one-way calls: higher throughput, a thread hop more of latency);
  /// false writes it at once on the calling thread. Order on the connection is kept
  /// either way. Requests are always written at once.
  bool combine_writes = true;
  /// When not null, set to the call's request id as soon as it has one (before it is sent;
  /// left alone when the call fails before that). The callee sees the same id as
  /// call_info::call, and both sides' trace spans record it as `call`: a layer above RPC
  /// joins its own trace events across workers through it (trace::flow_id).
  std::uint64_t* request_id = nullptr;
};

}  // namespace troupe::rpc
