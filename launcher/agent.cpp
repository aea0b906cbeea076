// Why this file is long (~800 lines): run_agent is troupe-run's one state machine (the
// rendezvous rounds, the job's store and secret, spawning, monitoring, restarts, in-place
// replacement and leaving a running job), and its steps share the round's state (the
// store, the group of workers, the attempt's counters and log folders). The helpers above
// it are the parts that need none of that state; the replace branch is the next piece to
// move out.
#include <troupe/launcher/agent.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <utility>

#include <troupe/core/error_file.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/launcher/metrics_server.hpp>
#include <troupe/launcher/node_rendezvous.hpp>
#include <troupe/launcher/signals.hpp>
#include <troupe/launcher/trace_attempts.hpp>
#include <troupe/launcher/worker_env.hpp>
#include <troupe/launcher/worker_group.hpp>
#include <troupe/membership/service.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

extern char** environ;

namespace troupe::launcher {

namespace {

void say(const std::string& text) {
  std::string line = "troupe-run: " + text + "\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "127.0.0.1";
  return buf;
}

std::string socket_ifname() { return settings::socket_ifname.value().value_or(std::string()); }

// This node's address as the other nodes reach it (exported as TROUPE_LOCAL_ADDR):
// --local-addr (or --rdzv-conf local_addr), which must be this host's; 127.0.0.1 for a job
// that cannot leave this host (--standalone, one node of the static backend, a loopback
// endpoint); else the first IPv4 address of the interface TROUPE_SOCKET_IFNAME names;
// else the address the host name resolves to, when that is not loopback. An explicit
// setting that is wrong is an error, never a fallback.
expected<std::string> node_address(const run_config& c) {
  const host_facts here = current_host_facts();
  if (!c.local_addr.empty()) {
    return check_local_address(here, c.local_addr, "--local-addr (or --rdzv-conf local_addr)");
  }
  std::string_view endpoint = c.rdzv_endpoint;
  for (std::string_view scheme : {"http://", "https://"})
    if (endpoint.starts_with(scheme)) endpoint.remove_prefix(scheme.size());
  auto hp = parse_host_port(endpoint);
  if (c.standalone || (c.backend == rdzv_backend::fixed && c.nnodes.max == 1) ||
      (hp && is_loopback_address(hp->first)))
    return std::string("127.0.0.1");
  if (auto ifname = socket_ifname(); !ifname.empty()) {
    auto a = interface_ipv4(here, ifname, settings::socket_ifname.variable);
    if (!a) return make_error(errc::invalid_argument, a.error().message());
    return a;
  }
  for (const auto& a : here.host_name_addresses)
    if (a.find(':') == std::string::npos && !is_loopback_address(a)) return a;
  return make_error(
      errc::invalid_argument, "cannot tell this node's address for a job across ",
      "nodes: the host name '", here.host_name, "' ",
      here.host_name_addresses.empty()
          ? std::string("does not resolve")
          : strcat("resolves only to loopback (", here.host_name_addresses.front(), ")"),
      "; pass --local-addr with the address the other nodes reach this one on, or "
      "set TROUPE_SOCKET_IFNAME to the interface of the network the nodes share");
}

// Where the store backend's server binds: the endpoint's host, except that a host *name*
// that resolves to loopback here (Debian maps a host's own name to 127.0.1.1) in a job of
// several nodes binds every interface, so that the other nodes reach it. A literal
// loopback address stays loopback (several nodes on one host, as in tests).
std::string store_bind_address(const run_config& c, const std::string& host) {
  if (c.nnodes.max <= 1 || is_loopback_address(host)) return host;
  const auto facts = current_host_facts();
  if (host == facts.host_name || host.find_first_not_of("0123456789.:") != std::string::npos) {
    auto a = check_local_address(facts, host, "--rdzv-endpoint");
    if (a && is_loopback_address(*a)) return "0.0.0.0";
  }
  return host;
}

// Where this node's job lives: the store, the embedded server when we host it, and the
// URL workers get.
struct job_store {
  std::unique_ptr<tcp_store_server> server;
  std::unique_ptr<store> base;
  std::unique_ptr<prefix_store> scoped;
  std::string url;
};

expected<job_store> open_job_store(const run_config& c, const std::string& run_id,
                                   const std::string& secret) {
  job_store j;
  store_options so;
  so.secret = secret;
  tcp_store_server_options own;
  own.secret = secret;
  // The job's TLS identity, when TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA are set:
  // the store then speaks TLS to the other nodes, and so does every client (connect_store
  // reads the same settings).
  own.tls = tls_config_from_env();
  // No request waits longer than the join timeout (--rdzv-conf timeout): an unreachable
  // store or etcd fails within it.
  so.timeout = std::min<duration>(std::chrono::seconds(30), c.join_timeout);
  so.connect_timeout = c.join_timeout;
  if (c.standalone || (c.backend == rdzv_backend::fixed && c.nnodes.max == 1)) {
    auto server = tcp_store_server::start(own);
    if (!server) return std::move(server).error();
    j.server = std::move(*server);
    j.url = j.server->url();
  } else if (c.backend == rdzv_backend::store) {
    auto hp = parse_host_port(c.rdzv_endpoint);
    if (!hp) return std::move(hp).error();
    if (c.is_host != 0) {
      tcp_store_server_options o = own;
      o.host = store_bind_address(c, hp->first);
      o.port = hp->second;
      auto server = tcp_store_server::start(o);
      if (!server && c.is_host == 1 && o.host != "0.0.0.0") {
        // Told to host an endpoint that is not an address of this node (a name other
        // nodes resolve differently, an address behind NAT): every interface then.
        o.host = "0.0.0.0";
        server = tcp_store_server::start(o);
      }
      if (server) {
        j.server = std::move(*server);
        say(strcat("hosting the rendezvous store at ", c.rdzv_endpoint));
      } else if (c.is_host == 1) {
        return make_error(errc::unavailable, "--rdzv-conf is_host=true, but the store cannot ",
                          "listen on ", c.rdzv_endpoint, ": ", server.error().message());
      }
    }
    j.url = "tcp://" + c.rdzv_endpoint;
  } else if (c.backend == rdzv_backend::etcd) {
    j.url = etcd_store_url(c);
  } else {
    return j;  // static with several nodes: no store
  }
  auto base = connect_store(j.url, so);
  if (!base)
    return make_error(base.error().code(), "cannot reach the rendezvous store ", j.url, ": ",
                      base.error().message());
  j.base = std::move(*base);
  j.scoped = std::make_unique<prefix_store>(*j.base, "troupe-run/" + run_id);
  return j;
}

// The job's secret: --secret-file, else TROUPE_JOB_SECRET (or its older name), else a
// fresh one when this node is the whole job. A job of several nodes with none runs open,
// and says so: the nodes must share a secret that only the user can hand them.
expected<std::string> job_secret(const run_config& c) {
  if (!c.secret_file.empty()) {
    auto s = read_secret_file(c.secret_file);
    if (!s) return make_error(s.error().code(), "--secret-file: ", s.error().message());
    return s;
  }
  if (auto s = job_secret_from_env(); !s.empty()) return s;
  if (c.standalone || c.nnodes.max == 1) return make_job_secret();
  say("warning: no job secret (--secret-file or TROUPE_JOB_SECRET): anyone who reaches this "
      "job's store can read and change it; give every node the same secret (docs/security.md)");
  return std::string();
}

void report_failure(const worker_exit& e, int attempt, const std::string& log_path,
                    const std::string& error_path, const std::string& node) {
  std::string text = strcat("worker rank ", e.rank, " (local rank ", e.local_rank, ", pid ", e.pid,
                            node, ") failed on attempt ", attempt, ": ", e.describe());
  if (auto root = read_error_file(error_path); !root.message.empty()) {
    text += strcat("\n--- root cause (", error_path, root.timestamp.empty() ? "" : ", timestamp ",
                   root.timestamp, ") ---\n", root.message);
    if (!root.stack.empty()) text += strcat("\n", root.stack);
    text += "\n--- end of root cause ---";
  }
  if (!e.stderr_tail.empty()) {
    text += strcat("\n--- last lines of its stderr (", log_path, ") ---\n", e.stderr_tail,
                   "\n--- end of stderr ---");
  } else {
    text += strcat(" (its stderr was empty; logs in ", log_path, ")");
  }
  say(text);
}

// With --failure-policy replace: takes the worker that exited out of the job's membership
// at once, instead of leaving the others to wait for its heartbeat to go silent. The
// worker is found by this host and its pid; one that never joined is not there. Best
// effort: a failure is said and the heartbeat settles it.
void declare_exited_dead(store& base, const std::string& workers_prefix, const worker_exit& e) {
  prefix_store scoped(base, workers_prefix + "/membership");
  const auto timeout = std::chrono::seconds(5);
  auto current = membership::read_epoch(scoped, timeout);
  if (!current) {
    say(strcat("could not read the membership to take worker rank ", e.rank,
               " out: ", current.error().message()));
    return;
  }
  const std::string host = this_host();
  for (const auto& m : current->members) {
    if (m.host != host || m.pid != static_cast<std::int64_t>(e.pid)) continue;
    membership::epoch_change change;
    change.remove.push_back({m.name, m.incarnation});
    change.cause = strcat("dead: ", membership::describe(m), ": its process ended with ",
                          e.describe(), ", seen by troupe-run on ", host);
    if (auto r = membership::apply_change(scoped, change, timeout); !r)
      say(strcat("could not take worker rank ", e.rank, " (", m.name, ") out of the membership: ",
                 r.error().message(), "; the others will notice its silent heartbeat"));
    return;
  }
}

// With --failure-policy replace, when this node leaves the running job: takes those of its
// workers (by this host and `pids`) that are still members out of the job's membership in
// one epoch, so that the others need not wait for their heartbeats. Workers that left
// gracefully are not there any more. Best effort, like declare_exited_dead.
void declare_workers_left(store& base, const std::string& workers_prefix,
                          const std::vector<pid_t>& pids, const std::string& why) {
  prefix_store scoped(base, workers_prefix + "/membership");
  const auto timeout = std::chrono::seconds(5);
  auto current = membership::read_epoch(scoped, timeout);
  if (!current) {
    say(strcat("could not read the membership to take this node's workers out: ",
               current.error().message(), "; the others will notice their silent heartbeats"));
    return;
  }
  const std::string host = this_host();
  membership::epoch_change change;
  std::string names;
  for (const auto& m : current->members) {
    if (m.host != host ||
        std::find(pids.begin(), pids.end(), static_cast<pid_t>(m.pid)) == pids.end())
      continue;
    change.remove.push_back({m.name, m.incarnation});
    names += strcat(names.empty() ? "" : ", ", membership::describe(m));
  }
  if (change.remove.empty()) return;
  change.cause = strcat("left: ", names, ": ", why);
  if (auto r = membership::apply_change(scoped, change, timeout); !r)
    say(strcat("could not take this node's workers (", names, ") out of the membership: ",
               r.error().message(), "; the others will notice their silent heartbeats"));
}

}  // namespace

std::string fresh_run_id() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

int run_agent(const run_config& c) {
  // Before any rendezvous: a typo in the program fails at once, not after every node joined.
  if (auto p = check_program(c.program, std::getenv("PATH")); !p) {
    say(p.error().message());
    return 2;
  }
  // So is an address setting that is wrong.
  auto addr = node_address(c);
  if (!addr) {
    say(addr.error().message());
    return 2;
  }
  // So is a metrics port that is taken: the endpoint listens before anything else starts.
  std::unique_ptr<metrics_server> metrics;
  if (c.metrics_port >= 0) {
    auto m = metrics_server::start(*addr, c.metrics_port);
    if (!m) {
      say(m.error().message());
      return 2;
    }
    metrics = std::move(*m);
    say(strcat("serving metrics at ", metrics->url(), "/metrics and the status at ", metrics->url(),
               "/status (port ", metrics->port(), ")"));
  }
  auto sigfd = install_signal_pipe();
  if (!sigfd) {
    say(sigfd.error().message());
    return 1;
  }
  // finish_config refuses a job of several nodes without an id, so a missing id here means
  // one node: a fresh id keeps this run's logs and store keys apart from every other run's.
  const std::string run_id = c.rdzv_id.empty() ? fresh_run_id() : c.rdzv_id;
  say(strcat("run id ", run_id, ", logs in ", c.log_dir, "/", run_id, ", program ", c.program, " (",
             c.nproc_per_node, " workers on this node)"));
  // What /status and /metrics show; the loop below keeps it current and publishes copies.
  job_status status;
  status.run_id = run_id;
  status.host = this_host();
  status.address = *addr;
  status.max_restarts = c.max_restarts;
  const auto publish = [&](std::string_view state) {
    if (!metrics) return;
    status.state = state;
    metrics->publish(status);
  };
  publish("starting");
  auto secret = job_secret(c);
  if (!secret) {
    say(secret.error().message());
    return 2;
  }
  const trace_attempts tracing(run_id);
  auto job = open_job_store(c, run_id, *secret);
  if (!job) {
    say(job.error().message());
    return 1;
  }
  const bool coordinated = c.backend != rdzv_backend::fixed;
  rendezvous_settings rs;
  rs.min_nodes = c.nnodes.min;
  rs.max_nodes = c.nnodes.max;
  rs.join_timeout = c.join_timeout;
  rs.last_call = c.nnodes.elastic() ? c.last_call : duration::zero();
  rs.heartbeat_timeout = c.heartbeat_timeout;
  // Replace mode: nodes arrive into and leave the running round; only fewer than MIN
  // nodes re-form the world (docs/launcher.md).
  rs.open_rounds = c.replace_failed;
  std::unique_ptr<node_rendezvous> rdzv;
  if (coordinated) rdzv = std::make_unique<node_rendezvous>(*job->scoped, rs);

  node_info me;
  me.addr = *addr;
  me.nproc = c.nproc_per_node;
  me.node_rank = c.node_rank;
  me.id = strcat(this_host(), ":", ::getpid());

  const bool limit_omp = should_limit_omp_threads(c.nproc_per_node);
  if (limit_omp)
    say(strcat("setting OMP_NUM_THREADS=1 for each of the ", c.nproc_per_node,
               " workers of this node (set it yourself to choose another value)"));

  // The rendezvous' news (open rounds: nodes that arrived or left), for the log.
  const auto say_news = [&] {
    if (rdzv)
      for (const auto& line : rdzv->take_news()) say(line);
  };
  // Replace mode: this node leaves the running job and the others run on. Its workers
  // (already stopped) that are still members are taken out of the membership of `round`.
  const auto leave_job = [&](long round, const std::vector<pid_t>& pids, const std::string& why) {
    if (job->base)
      declare_workers_left(*job->base, strcat("troupe-run/", run_id, "/workers/", round), pids,
                           why);
    if (auto l = rdzv->leave(why); !l)
      say(strcat("could not tell the other nodes that this node leaves: ", l.error().message(),
                 "; they will find its heartbeat silent"));
  };

  auto stop_now = [&](worker_group& group, long round) {
    int sig = stop_signal_received();
    say(strcat("received signal ", sig, "; stopping the workers (SIGKILL after ",
               format_duration(c.stop_grace), ")"));
    const auto pids = group.pids();
    group.stop(sig, c.stop_grace, [] { return stop_signal_count() >= 2; });
    if (rdzv && c.replace_failed) {
      leave_job(round, pids,
                strcat("the troupe-run of node ", me.id, " received signal ", sig,
                       "; its workers were stopped"));
      say("this node left the running job; the other nodes' workers run on");
    } else if (rdzv) {
      (void)rdzv->request_reform();
    }
    return 128 + sig;
  };

  // Replace mode: the nodes and workers of the running round as they arrive and leave,
  // for /status and the metrics; true when they changed.
  const auto follow_running = [&] {
    if (!rdzv || !c.replace_failed) return false;
    const auto v = rdzv->running();
    if (v.nodes == status.nodes && v.workers == status.world_size) return false;
    status.nodes = v.nodes;
    status.world_size = v.workers;
    return true;
  };

  // A stop request while the group is being stopped anyway: no need to wait politely.
  const auto interrupted = [] { return stop_signal_received() != 0; };
  bool store_lost = false;
  int restarts = 0;
  int attempt = 0;
  bool joined = false;
  // Announces this node for the next round with a fresh port while its workers still run
  // (they are stopped afterwards); false, after saying why, when the store refuses.
  const auto join_next_round = [&] {
    me.free_port = pick_free_port();
    if (auto j = rdzv->join(me); !j) {
      say("rendezvous failed: " + j.error().message());
      return false;
    }
    joined = true;
    return true;
  };
  for (;;) {
    round_result rr;
    if (!coordinated) {
      rr.round = attempt;
      rr.group_rank = c.node_rank;
      rr.rank_base = c.node_rank * c.nproc_per_node;
      rr.world_size = c.nnodes.max * c.nproc_per_node;
      node_info master = me;
      master.addr = "127.0.0.1";  // torchrun's default; --master-addr overrides it
      master.free_port = c.nnodes.max == 1 ? pick_free_port() : 29500;
      rr.nodes.assign(static_cast<std::size_t>(c.nnodes.max), master);
    } else {
      me.free_port = pick_free_port();
      if (!joined) {
        if (auto j = rdzv->join(me); !j) {
          say("rendezvous failed: " + j.error().message());
          return 1;
        }
      }
      joined = false;
      say(strcat("waiting for the rendezvous (nodes ", c.nnodes.min, ":", c.nnodes.max, ")"));
      publish("rendezvous");
      const std::int64_t waited_from = trace::now_ns();
      auto r = rdzv->await_round([] { return stop_signal_received() != 0; });
      say_news();
      if (!r) {
        if (r.error().code() == errc::aborted) return 128 + stop_signal_received();
        say("rendezvous failed: " + r.error().message());
        return 1;
      }
      rr = std::move(*r);
      if (rr.late)
        say(strcat("joined the running job in round ", rr.round, " as group rank ", rr.group_rank,
                   " with ranks ", rr.rank_base, "-", rr.rank_base + c.nproc_per_node - 1,
                   "; the other nodes' workers run on and this node's join their membership"));
      // The wait for this round, from joining it to the world it formed.
      if (trace::enabled())
        trace::complete("launcher", "rendezvous", waited_from, trace::now_ns(),
                        trace::args()
                            .add("round", static_cast<std::int64_t>(rr.round))
                            .add("group_rank", rr.group_rank)
                            .add("nodes", static_cast<std::int64_t>(rr.nodes.size()))
                            .add("world_size", rr.world_size));
    }
    ++status.rounds;
    status.round = rr.round;
    status.attempt = attempt;
    status.restarts = restarts;
    status.world_size = rr.world_size;
    status.nodes = static_cast<int>(rr.nodes.size());
    follow_running();
    status.workers.clear();
    const std::string master_addr = c.master_addr.empty() ? rr.nodes.front().addr : c.master_addr;
    const int master_port = c.master_port > 0 ? c.master_port : rr.nodes.front().free_port;
    const std::string attempt_dir = strcat(c.log_dir, "/", run_id, "/attempt_", attempt);

    // Worker `i`'s spec and status entry; `log_dir` is where its logs go (a replacement
    // gets its own, so the failed worker's logs stay).
    const auto make_worker = [&](int i, const std::string& log_dir) {
      worker_assignment a;
      a.local_rank = i;
      a.rank = rr.rank_base + i;
      a.group_rank = rr.group_rank;
      a.group_world_size = static_cast<int>(rr.nodes.size());
      a.role_rank = a.rank;
      a.local_world_size = c.nproc_per_node;
      a.world_size = rr.world_size;
      a.role_world_size = rr.world_size;
      a.role = c.role;
      a.master_addr = master_addr;
      a.master_port = master_port;
      a.local_addr = me.addr;
      a.socket_ifname = socket_ifname();
      a.restart_count = restarts;
      a.max_restarts = c.max_restarts;
      a.run_id = run_id;
      a.round = rr.round;
      a.store_url = job->url;
      a.secret = *secret;
      a.elastic = c.replace_failed;
      if (!a.store_url.empty())
        a.store_prefix = strcat("troupe-run/", run_id, "/workers/", rr.round);
      worker_spec s;
      s.local_rank = i;
      s.rank = a.rank;
      s.program = c.program;
      s.args = c.args;
      s.log_dir = log_dir;
      // The worker's root-cause file (torchrun's TORCHELASTIC_ERROR_FILE); a stale one from
      // an earlier run with the same id is removed so that it is not quoted.
      auto vars = worker_environment(a, limit_omp);
      const std::string error_path = s.log_dir + "/error.json";
      std::error_code ignored;
      std::filesystem::remove(error_path, ignored);
      vars.emplace_back(settings::error_file.variable, error_path);
      vars.emplace_back("TORCHELASTIC_ERROR_FILE", error_path);
      worker_status ws;
      ws.rank = a.rank;
      ws.local_rank = i;
      ws.state = "starting";
      ws.restarts = restarts;
      ws.log_dir = s.log_dir;
      if (metrics) {
        // The worker's metrics snapshot, which /metrics reads (docs/metrics.md).
        ws.metrics_file = s.log_dir + "/metrics";
        std::filesystem::remove(ws.metrics_file, ignored);
        vars.emplace_back(settings::metrics_file.variable, ws.metrics_file);
      }
      if (settings::trace.value())
        vars.emplace_back(settings::trace.variable, tracing.worker_dir(attempt));
      s.env = merged_environment(environ, vars);
      s.redirect = c.redirects.for_local_rank(i);
      s.tee = c.tee.for_local_rank(i);
      if (!c.local_ranks_filter.empty() &&
          std::find(c.local_ranks_filter.begin(), c.local_ranks_filter.end(), i) ==
              c.local_ranks_filter.end()) {
        s.redirect = stream_stdout | stream_stderr;  // filtered out: logs only
        s.tee = 0;
      }
      return std::make_pair(std::move(s), std::move(ws));
    };
    std::vector<worker_spec> specs;
    for (int i = 0; i < c.nproc_per_node; ++i) {
      auto [s, ws] = make_worker(i, strcat(attempt_dir, "/", rr.rank_base + i));
      specs.push_back(std::move(s));
      status.workers.push_back(std::move(ws));
    }
    // Declared before the group: it merges the attempt's trace once the group is gone.
    struct attempt_trace {
      const trace_attempts& t;
      int attempt;
      std::int64_t start = trace::now_ns();
      ~attempt_trace() {
        if (!t.on()) return;
        trace::complete("launcher", strcat("attempt ", attempt), start, trace::now_ns(),
                        trace::args().add("attempt", attempt));
        t.merge(attempt, [](const std::string& s) { say(s); });
      }
    } attempt_tracing{tracing, attempt};
    worker_group group;
    if (stop_signal_received() != 0) return 128 + stop_signal_received();
    if (auto st = group.start(std::move(specs)); !st) {
      say(st.error().message());
      return 1;
    }
    {
      const auto pids = group.pids();
      for (std::size_t i = 0; i < status.workers.size() && i < pids.size(); ++i) {
        status.workers[i].pid = pids[i];
        status.workers[i].state = "running";
      }
    }
    // Records how workers ended; `rest` is the state of those still running.
    const auto note_exits = [&](const std::vector<worker_exit>& exits, std::string_view rest) {
      for (auto& w : status.workers) {
        bool ended = false;
        for (const auto& e : exits)
          if (e.rank == w.rank) {
            w.state = e.failed() ? strcat("failed (", e.describe(), ")") : std::string("succeeded");
            ended = true;
          }
        if (!ended && !rest.empty() && w.state == "running") w.state = rest;
      }
    };
    if (trace::enabled()) {
      auto pids = group.pids();
      for (std::size_t i = 0; i < pids.size(); ++i)
        trace::instant("launcher", "spawn",
                       trace::args()
                           .add("rank", rr.rank_base + static_cast<int>(i))
                           .add("pid", static_cast<std::int64_t>(pids[i]))
                           .add("attempt", attempt)
                           .add("round", rr.round)
                           .add("restarts", restarts));
    }
    std::string last_status;
    auto show_status = [&] {
      std::string s =
          strcat("round ", rr.round, ": ", group.running(), "/", group.size(),
                 " workers running (ranks ", rr.rank_base, "-", rr.rank_base + c.nproc_per_node - 1,
                 " of ", rr.world_size, "), restarts ", restarts, "/", c.max_restarts);
      if (s != last_status) {
        say(s);
        publish("running");
      }
      last_status = std::move(s);
    };
    show_status();

    auto next_check = clock::now() + c.monitor_interval;
    bool reform = false;
    for (;;) {
      auto wait = std::chrono::duration_cast<duration>(next_check - clock::now());
      group.pump(std::max(duration::zero(), wait), *sigfd);
      drain_signal_pipe();
      if (stop_signal_received() != 0) return stop_now(group, rr.round);
      auto exits = group.reap();
      if (!exits.empty()) {
        note_exits(exits, {});
        publish("running");
      }
      if (trace::enabled())
        for (const auto& e : exits)
          trace::instant("launcher", "exit",
                         trace::args()
                             .add("rank", e.rank)
                             .add("pid", static_cast<std::int64_t>(e.pid))
                             .add("status", e.describe())
                             .add("failed", e.failed() ? "yes" : "no"));
      const worker_exit* failure = nullptr;
      for (const auto& e : exits)
        if (e.failed()) {
          failure = &e;
          break;
        }
      // The first failure is the one whose error file says it failed first; without error
      // files, the first one reaped.
      std::string first_time;
      // Where worker `e` (the one now in its slot, or the one that just ended) logs.
      const auto dir_of = [&](const worker_exit& e) {
        const auto i = static_cast<std::size_t>(e.local_rank);
        return i < status.workers.size() ? status.workers[i].log_dir
                                         : strcat(attempt_dir, "/", e.rank);
      };
      for (const auto& e : exits) {
        if (!e.failed()) continue;
        auto root = read_error_file(dir_of(e) + "/error.json");
        if (!root.timestamp.empty() &&
            (first_time.empty() || std::strtoll(root.timestamp.c_str(), nullptr, 10) <
                                       std::strtoll(first_time.c_str(), nullptr, 10))) {
          first_time = root.timestamp;
          failure = &e;
        }
      }
      const std::string on_node =
          c.nnodes.max > 1 ? strcat(", on node ", this_host(), " (group rank ", rr.group_rank, ")")
                           : std::string();
      if (failure != nullptr && c.replace_failed) {
        // Replace mode: each failed worker alone gets a successor; the others run on.
        bool gave_up = false;
        for (const auto& e : exits) {
          if (!e.failed()) continue;
          report_failure(e, attempt, dir_of(e) + "/stderr", dir_of(e) + "/error.json", on_node);
          if (job->base)
            declare_exited_dead(*job->base, strcat("troupe-run/", run_id, "/workers/", rr.round),
                                e);
          if (restarts >= c.max_restarts) {
            say(strcat("giving up: worker rank ", e.rank, " failed with ", e.describe(),
                       " and all ", c.max_restarts, " replacements (--max-restarts) are used up"));
            gave_up = true;
            break;
          }
          ++restarts;
          status.restarts = restarts;
          const auto i = e.local_rank;
          auto [spec, ws] =
              make_worker(i, strcat(attempt_dir, "/", e.rank, "-replacement-", restarts));
          say(strcat("replacing worker rank ", e.rank, " (replacement ", restarts, " of ",
                     c.max_restarts, "); the other workers run on; its logs are in ",
                     spec.log_dir));
          if (auto r = group.replace(static_cast<std::size_t>(i), std::move(spec)); !r) {
            say(strcat("cannot start the replacement of worker rank ", e.rank, ": ",
                       r.error().message()));
            gave_up = true;
            break;
          }
          const pid_t pid = group.pids()[static_cast<std::size_t>(i)];
          ws.pid = pid;
          ws.state = "running";
          status.workers[static_cast<std::size_t>(i)] = std::move(ws);
          if (trace::enabled())
            trace::instant("launcher", "replace",
                           trace::args()
                               .add("rank", e.rank)
                               .add("pid", static_cast<std::int64_t>(pid))
                               .add("replacement", restarts)
                               .add("status", e.describe()));
        }
        if (gave_up) {
          const auto pids = group.pids();
          group.stop(SIGTERM, c.stop_grace, interrupted);
          if (rdzv) {
            // This node leaves; the others run on (fewer than MIN left re-form the world).
            leave_job(rr.round, pids,
                      strcat("node ", me.id, " used up its replacements (--max-restarts ",
                             c.max_restarts, ")"));
            say("this node left the running job; the other nodes' workers run on");
          }
          return 1;
        }
        publish("running");
        show_status();
        continue;
      }
      if (failure != nullptr) {
        report_failure(*failure, attempt, dir_of(*failure) + "/stderr",
                       dir_of(*failure) + "/error.json", on_node);
        if (restarts >= c.max_restarts) {
          group.stop(SIGTERM, c.stop_grace, interrupted);
          // A store this node has lost would only hold it up for op_timeout; the other
          // nodes find its heartbeat silent instead.
          if (rdzv && !store_lost) (void)rdzv->request_reform();
          say(strcat("giving up: the worker group failed and all ", c.max_restarts,
                     " restarts (--max-restarts) are used up; the failure was worker rank ",
                     failure->rank, " with ", failure->describe(), " (see above)"));
          return 1;
        }
        ++restarts;
        say(strcat("restarting the worker group (restart ", restarts, " of ", c.max_restarts, ")"));
        status.restarts = restarts;
        note_exits({}, "stopped");
        publish("restarting");
        if (trace::enabled())
          trace::instant("launcher", "restart",
                         trace::args()
                             .add("restart", restarts)
                             .add("max_restarts", c.max_restarts)
                             .add("failed_rank", failure->rank)
                             .add("status", failure->describe()));
        if (rdzv && !join_next_round()) {
          group.stop(SIGTERM, c.stop_grace, interrupted);
          return 1;
        }
        group.stop(SIGTERM, c.stop_grace, interrupted);
        reform = true;
        break;
      }
      if (group.running() == 0) {
        say(strcat("all ", group.size(), " workers of this node finished successfully"));
        publish("finished");
        if (rdzv && (rr.nodes.size() > 1 || c.replace_failed)) {
          // Stay (and keep a hosted store up) until the other nodes are done too.
          auto done = rdzv->finish(c.exit_barrier_timeout, interrupted);
          say_news();
          if (!done) say("not all nodes finished: " + done.error().message());
        }
        return 0;
      }
      if (clock::now() >= next_check) {
        next_check = clock::now() + c.monitor_interval;
        if (rdzv) {
          auto change = rdzv->should_reform();
          say_news();
          if (follow_running()) publish(std::string(status.state));
          if (!change) {
            if (!store_lost) say("lost the rendezvous store: " + change.error().message());
            store_lost = true;
          } else if (std::exchange(store_lost, false)) {
            say("the rendezvous store answers again");
          }
          if (change && *change) {
            say(strcat("the world of round ", rr.round, " changes; re-forming it"));
            note_exits({}, "stopped");
            publish("re-forming");
            if (!join_next_round()) {
              group.stop(SIGTERM, c.stop_grace, interrupted);
              return 1;
            }
            group.stop(SIGTERM, c.stop_grace, interrupted);
            reform = true;
            break;
          }
        }
      }
      show_status();
    }
    if (reform) ++attempt;
  }
}

}  // namespace troupe::launcher
