// run_config: everything troupe-run was told, validated. The parsers here are what the
// command line (launcher/cli.hpp) uses; each error names the flag, quotes the bad value
// and says what is accepted.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe::launcher {

/// How many nodes a job takes: fixed (min == max) or elastic (min < max).
struct node_range {
  int min = 1;
  int max = 1;
  bool elastic() const noexcept { return min != max; }
};

/// How nodes find each other.
enum class rdzv_backend {
  /// No coordination: --nnodes N nodes, each told its --node-rank.
  fixed,
  /// Rounds kept in a troupe TCP store at --rdzv-endpoint (hosted by one of the nodes).
  store,
  /// Rounds kept in etcd at --rdzv-endpoint.
  etcd,
};
std::string_view to_string(rdzv_backend b) noexcept;

/// Which of a worker's streams a --redirects or --tee value selects: bit 1 stdout,
/// bit 2 stderr (0 none, 1 stdout, 2 stderr, 3 both), for all local ranks or per rank.
struct stream_selection {
  int all = 0;
  std::map<int, int> per_local_rank;
  /// The bits for one local rank.
  int for_local_rank(int local_rank) const;
};
inline constexpr int stream_stdout = 1;
inline constexpr int stream_stderr = 2;

struct run_config {
  node_range nnodes;
  /// Workers on this node (after resolving auto / cpu / gpu).
  int nproc_per_node = 1;
  /// This node's rank; -1 when not given (then assigned at rendezvous).
  int node_rank = -1;
  rdzv_backend backend = rdzv_backend::fixed;
  /// host:port of the rendezvous store (store and etcd backends).
  std::string rdzv_endpoint;
  /// The job's id, shared by all its nodes; also the run id the workers see. Empty: a fresh
  /// unique id (allowed only for a job of one node).
  std::string rdzv_id;
  /// --rdzv-conf as given, and the values read from it.
  std::map<std::string, std::string> rdzv_conf;
  /// How long to wait for MIN nodes (rdzv-conf timeout / join_timeout).
  duration join_timeout = std::chrono::seconds(600);
  /// Once MIN nodes have joined, how long to wait for more (up to MAX) before starting.
  duration last_call = std::chrono::seconds(1);
  /// A node whose heartbeat has not moved for this long is taken for dead and the world
  /// re-forms without it (rdzv-conf heartbeat_timeout; 0 turns heartbeats off).
  duration heartbeat_timeout = std::chrono::seconds(15);
  /// How long a node whose workers succeeded waits for the other nodes of its round to
  /// finish too (rdzv-conf exit_barrier_timeout).
  duration exit_barrier_timeout = std::chrono::seconds(300);
  /// Whether this node hosts the TCP store of the store backend: -1 try (bind if the
  /// endpoint is local and free), 0 never, 1 always (rdzv-conf is_host).
  int is_host = -1;
  /// This node's address as other nodes should reach it (rdzv-conf local_addr).
  std::string local_addr;
  /// How the etcd backend reaches etcd (rdzv-conf protocol, cacert, cert, key, user,
  /// password_file; torchrun's etcd rendezvous reads the first four too). An https://
  /// endpoint sets etcd_https. Paths are made absolute, for the workers.
  bool etcd_https = false;
  std::string etcd_cacert;
  std::string etcd_cert;
  std::string etcd_key;
  std::string etcd_user;
  std::string etcd_password_file;
  /// --secret-file: the file holding the job's secret (empty: TROUPE_JOB_SECRET, else a
  /// fresh one for a job of one node).
  std::string secret_file;
  bool standalone = false;
  int max_restarts = 0;
  /// --failure-policy replace: a failed worker is replaced alone while the others run on
  /// (each replacement counts against max_restarts), and workers get TROUPE_ELASTIC=1.
  /// false (restart, the default): the node's whole worker group restarts.
  bool replace_failed = false;
  /// How often membership and the status line are checked (exits are noticed at once).
  duration monitor_interval = std::chrono::milliseconds(100);
  /// How long workers get to exit after SIGTERM before SIGKILL.
  duration stop_grace = std::chrono::seconds(5);
  std::string role = "default";
  /// Root of the per-run log folders.
  std::string log_dir;
  stream_selection redirects;
  stream_selection tee;
  /// --local-ranks-filter: only these local ranks' output reaches the console (their logs
  /// are written all the same); empty: every local rank.
  std::vector<int> local_ranks_filter;
  /// Empty: taken from the rank-0 node at each round.
  std::string master_addr;
  /// -1: picked free by the rank-0 node at each round.
  int master_port = -1;
  /// --metrics-port: the port of the /metrics and /status endpoint (0: a free one; -1: off).
  int metrics_port = -1;
  /// The worker executable and its arguments.
  std::string program;
  std::vector<std::string> args;
};

/// "--nnodes": "N" or "MIN:MAX" with 1 <= MIN <= MAX.
expected<node_range> parse_nnodes(std::string_view text);
/// "--nproc-per-node": "auto" (GPUs if any, else CPUs), "cpu", "gpu" (fails without a
/// GPU) or a positive count.
expected<int> parse_nproc_per_node(std::string_view text);
/// "--rdzv-backend": static, store (c10d is accepted as an alias) or etcd.
expected<rdzv_backend> parse_rdzv_backend(std::string_view text);
/// Resolves PROGRAM as exec would (a name without '/' is looked up on PATH) and checks that it
/// is an executable file; the error names what was wrong. Done before any rendezvous, so a
/// typo fails at once rather than after every node joined.
expected<std::string> check_program(std::string_view program, const char* path_env);
/// "--local-ranks-filter": "0,1,3" (empty: all).
expected<std::vector<int>> parse_local_ranks_filter(std::string_view text);
/// "--rdzv-conf": "k=v,k=v" (empty allowed).
expected<std::map<std::string, std::string>> parse_rdzv_conf(std::string_view text);

/// The store URL of an etcd job, with its TLS and user options (the workers read it from
/// TROUPE_STORE_URL): "etcd://host:port[?protocol=https&cacert=...]". Paths are %-escaped.
std::string etcd_store_url(const run_config& c);

/// What a --rdzv-conf key sets.
enum class rdzv_conf_setting {
  join_timeout,
  last_call,
  heartbeat_timeout,
  exit_barrier_timeout,
  is_host,
  local_addr,
  etcd_protocol,
  etcd_cacert,
  etcd_cert,
  etcd_key,
  etcd_user,
  etcd_password_file,
  ignored,
};

/// One key --rdzv-conf accepts. The table is the single source of the keys: finish_config reads
/// values through it and every refusal lists it, so the two cannot drift apart.
struct rdzv_conf_key {
  std::string_view name;
  rdzv_conf_setting what;
  bool torchrun_only;  ///< accepted for torchrun compatibility, no effect
};

/// Every key --rdzv-conf accepts, aliases included, in the order the help lists them.
const std::vector<rdzv_conf_key>& rdzv_conf_keys();

/// The entry for `name`, or nullptr when --rdzv-conf does not know it.
const rdzv_conf_key* find_rdzv_conf_key(std::string_view name);

/// "timeout, join_timeout, ... and store_type (accepted, unused)": for error messages.
std::string rdzv_conf_key_list();
/// "--redirects" / "--tee": "0".."3", or "local_rank:bits,..." such as "0:1,1:3".
expected<stream_selection> parse_stream_selection(std::string_view flag, std::string_view text);
/// A non-negative integer for `flag`; the error names the flag and the value.
expected<int> parse_flag_int(std::string_view flag, std::string_view text, int min, int max);
/// A duration for `flag` ("250ms", "5s", a bare number of seconds).
expected<duration> parse_flag_duration(std::string_view flag, std::string_view text);

/// Checks the combination of flags and fills the values derived from others
/// (rdzv-conf keys, the standalone defaults). The errors name the flags involved.
expected<void> finish_config(run_config& config);

}  // namespace troupe::launcher
