#include <troupe/launcher/cli.hpp>

#include <CLI/CLI.hpp>
#include <cctype>

namespace troupe::launcher {

namespace {

constexpr const char* description =
    "troupe-run: starts NPROC workers on this node, gives each its rank and world through "
    "the environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, "
    "TROUPE_STORE_URL, ...), restarts the node's workers when one fails, and re-forms the "
    "world when nodes join or leave an elastic job.\n\n"
    "  troupe-run --standalone --nproc-per-node 4 ./train --epochs 3\n"
    "  troupe-run --nnodes 1:4 --nproc-per-node 8 --rdzv-backend etcd \\\n"
    "             --rdzv-endpoint etcd0:2379 --rdzv-id job7 ./train\n"
    "  troupe-run status HOST:PORT   (the status of a job started with --metrics-port)\n";

// The options in one place so that --help lists them in this order.
struct raw_flags {
  std::string nnodes = "1";
  std::string nproc = "1";
  std::string node_rank;
  std::string backend = "static";
  std::string endpoint;
  std::string id;
  std::string conf;
  bool standalone = false;
  std::string max_restarts = "0";
  std::string failure_policy = "restart";
  std::string monitor_interval = "0.1";
  std::string stop_grace = "5s";
  std::string role = "default";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string master_addr;
  std::string master_port;
  std::string local_addr;
  std::string secret_file;
  std::string start_method = "spawn";
  bool no_python = false;
  std::string local_ranks_filter;
  std::string metrics_port;
};

expected<run_config> convert(const raw_flags& f, std::vector<std::string> rest) {
  run_config c;
  auto nn = parse_nnodes(f.nnodes);
  if (!nn) return std::move(nn).error();
  c.nnodes = *nn;
  auto np = parse_nproc_per_node(f.nproc);
  if (!np) return std::move(np).error();
  c.nproc_per_node = *np;
  if (!f.node_rank.empty()) {
    auto r = parse_flag_int("--node-rank", f.node_rank, 0, 1 << 20);
    if (!r) return std::move(r).error();
    c.node_rank = *r;
  }
  auto b = parse_rdzv_backend(f.backend);
  if (!b) return std::move(b).error();
  c.backend = *b;
  c.rdzv_endpoint = f.endpoint;
  if (!f.id.empty()) c.rdzv_id = f.id;
  auto conf = parse_rdzv_conf(f.conf);
  if (!conf) return std::move(conf).error();
  c.rdzv_conf = std::move(*conf);
  c.standalone = f.standalone;
  auto mr = parse_flag_int("--max-restarts", f.max_restarts, 0, 1 << 20);
  if (!mr) return std::move(mr).error();
  c.max_restarts = *mr;
  if (f.failure_policy == "replace") {
    c.replace_failed = true;
  } else if (f.failure_policy != "restart") {
    return make_error(errc::invalid_argument, "--failure-policy: '", f.failure_policy,
                      "' is not valid; write restart (stop and restart the node's workers, "
                      "the default) or replace (start a new worker in place of the failed one "
                      "while the others run on)");
  }
  auto mi = parse_flag_duration("--monitor-interval", f.monitor_interval);
  if (!mi) return std::move(mi).error();
  if (mi->count() <= 0)
    return make_error(errc::invalid_argument, "--monitor-interval: '", f.monitor_interval,
                      "' is not valid; it must be positive (e.g. 0.1 or 100ms)");
  c.monitor_interval = *mi;
  auto sg = parse_flag_duration("--stop-grace", f.stop_grace);
  if (!sg) return std::move(sg).error();
  c.stop_grace = *sg;
  c.role = f.role;
  c.log_dir = f.log_dir;
  auto rd = parse_stream_selection("--redirects", f.redirects);
  if (!rd) return std::move(rd).error();
  c.redirects = std::move(*rd);
  auto te = parse_stream_selection("--tee", f.tee);
  if (!te) return std::move(te).error();
  c.tee = std::move(*te);
  auto lf = parse_local_ranks_filter(f.local_ranks_filter);
  if (!lf) return std::move(lf).error();
  c.local_ranks_filter = std::move(*lf);
  if (f.start_method != "spawn" && f.start_method != "fork" && f.start_method != "forkserver")
    return make_error(errc::invalid_argument, "--start-method: '", f.start_method,
                      "' is not valid; write spawn, fork or forkserver (troupe-run always "
                      "starts workers with fork and exec, so the choice has no effect)");
  c.master_addr = f.master_addr;
  if (!f.master_port.empty()) {
    auto p = parse_flag_int("--master-port", f.master_port, 1, 65535);
    if (!p) return std::move(p).error();
    c.master_port = *p;
  }
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (!rest.empty() && rest.front().starts_with("-"))
    return make_error(errc::invalid_argument, "unknown flag '", rest.front(),
                      "'; run troupe-run --help for the flags (the worker program comes after "
                      "them)");
  if (!rest.empty()) {
    c.program = rest.front();
    c.args.assign(rest.begin() + 1, rest.end());
  }
  TROUPE_TRY(finish_config(c));
  if (!f.local_addr.empty()) c.local_addr = f.local_addr;  // wins over --rdzv-conf local_addr
  c.secret_file = f.secret_file;
  if (!f.metrics_port.empty()) {
    auto p = parse_flag_int("--metrics-port", f.metrics_port, 0, 65535);
    if (!p) return std::move(p).error();
    c.metrics_port = *p;
  }
  return c;
}

}  // namespace

cli_outcome parse_command_line(int argc, const char* const* argv) {
  CLI::App app{description, "troupe-run"};
  app.prefix_command();  // the first positional and everything after it go to the worker
  app.get_formatter()->column_width(34);
  raw_flags f;
  app.add_option("--nnodes", f.nnodes,
                 "Nodes in the job: N, or MIN:MAX for an elastic job (default 1)");
  app.add_option("--nproc-per-node,--nproc_per_node", f.nproc,
                 "Workers on this node: a count, cpu (one per CPU), gpu (one per CUDA device) "
                 "or auto (gpu if any, else cpu) (default 1)");
  app.add_option("--node-rank,--node_rank", f.node_rank,
                 "This node's rank, 0 to NNODES-1; needed by the static backend with several "
                 "nodes, an ordering hint for the others");
  app.add_option("--rdzv-backend,--rdzv_backend", f.backend,
                 "How nodes meet: static (no coordination), store (a troupe TCP store; c10d "
                 "is an alias) or etcd (default static)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", f.endpoint,
                 "host:port of the rendezvous store (store: hosted by the first node able to "
                 "bind it unless is_host says otherwise; etcd: host:port, http://host:port "
                 "or https://host:port)");
  app.add_option("--rdzv-id,--rdzv_id", f.id,
                 "The job id shared by all its nodes; becomes TROUPE_RUN_ID (default: a fresh "
                 "unique id on a job of one node; a job of several nodes must give one)");
  app.add_option("--rdzv-conf,--rdzv_conf", f.conf,
                 "k=v,... : timeout (wait for MIN nodes, default 600s), last_call_timeout "
                 "(wait for more nodes once MIN are in, default 1s), heartbeat_timeout (a node "
                 "silent this long is taken for dead, "
                 "default 15s, 0: off), exit_barrier_timeout (how long a "
                 "finished node waits for the others, default 300s), is_host (true/false: host "
                 "the store backend's server), local_addr (this node's address for MASTER_ADDR); "
                 "etcd only: protocol (http/https), cacert, cert, key (PEM files for TLS), user "
                 "and password_file (an etcd user, its password in the file's first line)");
  app.add_flag("--standalone", f.standalone,
               "One node with its own store on a free loopback port and a fresh run id");
  app.add_option("--max-restarts,--max_restarts", f.max_restarts,
                 "Worker-group restarts after failures before giving up (default 0)");
  app.add_option("--failure-policy,--failure_policy", f.failure_policy,
                 "What a failed worker costs: restart (stop the node's workers and start them "
                 "all again, as torchrun does) or replace (start a new worker in its place while "
                 "the others run on; workers get TROUPE_ELASTIC=1 and must follow the job's "
                 "membership, docs/membership.md; nodes that arrive join the running job and "
                 "nodes that leave are let go, without restarting the other nodes' workers). "
                 "Each restart or replacement counts against --max-restarts (default restart)");
  app.add_option("--monitor-interval,--monitor_interval", f.monitor_interval,
                 "How often membership changes are checked; worker exits are noticed at once "
                 "(default 100ms)");
  app.add_option("--stop-grace,--stop_grace", f.stop_grace,
                 "How long stopped workers get between SIGTERM and SIGKILL (default 5s)");
  app.add_option("--role", f.role, "The workers' role name (default 'default')");
  app.add_option("--log-dir,--log_dir", f.log_dir,
                 "Root of the logs <log-dir>/<run-id>/attempt_<n>/<rank>/{stdout,stderr} "
                 "(default $TMPDIR/troupe-run)");
  app.add_option("--redirects,-r", f.redirects,
                 "Streams sent to the log files only, not the console: 0 none, 1 stdout, 2 "
                 "stderr, 3 both, or per local rank as 0:1,1:2 (default 0)");
  app.add_option("--tee,-t", f.tee,
                 "Streams sent to the console as well as the log files (same values as "
                 "--redirects; output always reaches the log files) (default 0)");
  app.add_option("--master-addr,--master_addr", f.master_addr,
                 "MASTER_ADDR for the workers (default: the address of the node holding rank 0)");
  app.add_option("--master-port,--master_port", f.master_port,
                 "MASTER_PORT for the workers (default: a free port on that node, per round)");
  app.add_option("--local-addr,--local_addr", f.local_addr,
                 "This node's address as the other nodes reach it, exported to the workers as "
                 "TROUPE_LOCAL_ADDR (every worker binds and advertises it) and MASTER_ADDR on "
                 "rank 0's node (default: --rdzv-conf local_addr, else the address of the "
                 "interface TROUPE_SOCKET_IFNAME names, else the host name's address; "
                 "127.0.0.1 for --standalone, one node, or a loopback endpoint)");
  app.add_option("--secret-file,--secret_file", f.secret_file,
                 "A file holding the job's secret (the same on every node): the job's store "
                 "refuses clients without it and the workers get it as TROUPE_JOB_SECRET "
                 "(default: TROUPE_JOB_SECRET from the environment, else a fresh random secret "
                 "for a job of one node; a job of several nodes needs one of the two)");
  app.add_option("--local-ranks-filter,--local_ranks_filter", f.local_ranks_filter,
                 "Only these local ranks' output reaches the console, e.g. 0 or 0,2 (all "
                 "ranks' output still reaches the log files) (default: all)");
  app.add_option("--metrics-port,--metrics_port", f.metrics_port,
                 "Serve GET /metrics (Prometheus text) and GET /status (JSON) over HTTP on "
                 "this port of the node's address; 0 picks a free port and prints it "
                 "(default: off). `troupe-run status HOST:PORT` prints the status as a table");
  app.add_option("--start-method,--start_method", f.start_method,
                 "Accepted for torchrun compatibility: spawn, fork or forkserver; troupe-run "
                 "always starts workers with fork and exec, so it has no effect");
  app.add_flag("--no-python,--no_python", f.no_python,
               "Accepted for torchrun compatibility: troupe-run always runs PROGRAM directly "
               "and never prepends python, so it has no effect");
  app.set_version_flag("--version", std::string("troupe-run ") + TROUPE_VERSION_STRING);
  // torchrun's convention: every flag can also come from PET_<FLAG> (upper case, '_' for
  // '-'); the command line wins over the environment.
  for (CLI::Option* o : app.get_options()) {
    std::string name = o->get_single_name();
    if (name.empty() || name == "help" || name == "version" || name.size() < 2) continue;
    std::string env = "PET_";
    for (char ch : name)
      env += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    o->envname(env);
  }
  app.footer(
      "After the flags: PROGRAM [ARGS...] (a leading -- is allowed). Workers see RANK, "
      "LOCAL_RANK, GROUP_RANK, ROLE_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, ROLE_WORLD_SIZE, "
      "GROUP_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TROUPE_RESTART_COUNT, "
      "TROUPE_MAX_RESTARTS, TROUPE_RUN_ID, TROUPE_ROUND, TROUPE_STORE_URL, TROUPE_STORE_PREFIX, "
      "TROUPE_LOCAL_ADDR, TROUPE_JOB_SECRET, TROUPE_ELASTIC (with --failure-policy replace), "
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, and "
      "OMP_NUM_THREADS=1 when several run on a node and it is not set already, "
      "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME when TROUPE_SOCKET_IFNAME is given, and "
      "TROUPE_ERROR_FILE and TORCHELASTIC_ERROR_FILE (where a failing worker records its root "
      "cause; the failure report quotes it), and TROUPE_METRICS_FILE with --metrics-port (where "
      "a worker writes its metrics snapshot). Every flag can also be set as PET_<FLAG> "
      "(e.g. PET_NPROC_PER_NODE=4); the command line wins. Durations: 250ms, 5s, 2m or "
      "seconds such as 0.1. Exit codes: 0 success, 1 failure, 2 bad usage, 128+N after "
      "signal N.");

  cli_outcome out;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out.exit_code = 0;
    out.message = app.help();
    return out;
  } catch (const CLI::CallForVersion& v) {
    out.exit_code = 0;
    out.message = v.what();
    return out;
  } catch (const CLI::ParseError& e) {
    out.exit_code = 2;
    out.message = std::string(e.what()) + "\nRun with --help for the flags.";
    return out;
  }
  auto config = convert(f, app.remaining());
  if (!config) {
    out.exit_code = 2;
    out.message = config.error().message();
    return out;
  }
  out.config = std::move(*config);
  return out;
}

}  // namespace troupe::launcher
