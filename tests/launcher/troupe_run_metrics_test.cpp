// troupe-run --metrics-port with real workers doing RPC and collectives: /metrics read by a
// real Prometheus text parser (python3-prometheus-client), /status, `troupe-run status`,
// the endpoint's bounds, and a port in use.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "process_helpers.hpp"

using namespace launcher_test;

namespace {

const std::string troupe_run = TROUPE_RUN_BINARY;
const std::string worker = TROUPE_METRICS_TEST_WORKER;
const std::string parser = TROUPE_PROMETHEUS_PARSE;

// A TCP connection to 127.0.0.1:port with 5 s send and receive timeouts (-1: refused).
int dial(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct http_reply {
  int status = 0;
  std::string body;
};

// Sends `request` raw and reads the whole answer (the server closes after one).
http_reply http_exchange(int port, const std::string& request) {
  http_reply r;
  int fd = dial(port);
  if (fd < 0) return r;
  std::size_t sent = 0;
  while (sent < request.size()) {
    auto n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  std::string all;
  char buf[65536];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (all.rfind("HTTP/1.1 ", 0) != 0) return r;
  r.status = std::stoi(all.substr(9, 3));
  if (auto p = all.find("\r\n\r\n"); p != std::string::npos) r.body = all.substr(p + 4);
  return r;
}

http_reply get(int port, const std::string& path) {
  return http_exchange(port,
                       "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

// The port troupe-run printed ("... (port N)"), or 0 while it has not.
int printed_port(const launcher_process& p) {
  std::smatch m;
  const std::string text = p.text();
  static const std::regex re("serving metrics at http://127\\.0\\.0\\.1:([0-9]+)/metrics");
  return std::regex_search(text, m, re) ? std::stoi(m[1]) : 0;
}

// What prometheus_parse.py found: family types by name, and samples.
struct parsed {
  std::map<std::string, std::string> types;
  struct sample {
    std::string name, labels;
    double value;
  };
  std::vector<sample> samples;
  /// The sum of `name` over every label set that contains `with`.
  double sum(const std::string& name, const std::string& with = "") const {
    double s = 0;
    for (const auto& x : samples)
      if (x.name == name && x.labels.find(with) != std::string::npos) s += x.value;
    return s;
  }
  std::set<std::string> ranks_of(const std::string& name) const {
    std::set<std::string> out;
    static const std::regex re("(^|,)rank=([0-9]+)");
    for (const auto& x : samples) {
      std::smatch m;
      if (x.name == name && std::regex_search(x.labels, m, re)) out.insert(m[2]);
    }
    return out;
  }
};

parsed parse_with_prometheus_client(const std::string& text, const fs::path& dir) {
  const auto in = dir / "scrape.txt";
  { std::ofstream(in) << text; }
  auto p = start({"/usr/bin/python3", parser, in.string()}, dir / "parsed.txt");
  REQUIRE(p->wait(30s));
  INFO(p->text());
  REQUIRE_MESSAGE(p->exit_code() != 3,
                  "python3-prometheus-client is missing: apt-get install "
                  "python3-prometheus-client (scripts/install-deps.sh)");
  REQUIRE(p->exit_code() == 0);
  parsed out;
  std::istringstream lines(p->text());
  std::string kind;
  while (lines >> kind) {
    if (kind == "F") {
      std::string name, type;
      lines >> name >> type;
      out.types[name] = type;
    } else {
      parsed::sample s;
      std::string value;
      lines >> s.name >> s.labels >> value;
      s.value = std::stod(value);
      out.samples.push_back(s);
    }
  }
  return out;
}

std::vector<std::string> job(const fs::path& dir, const std::string& port,
                             std::vector<std::string> extra = {}) {
  std::vector<std::string> args{
      troupe_run,  "--standalone",          "--nproc-per-node", "2", "--metrics-port", port,
      "--log-dir", (dir / "logs").string(), "--stop-grace",     "2s"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {worker, (dir / "stop").string()});
  return args;
}

}  // namespace

TEST_CASE("a job's metrics are served in Prometheus text format, and its counters grow") {
  auto dir = fresh_dir("metrics");
  auto p = start(job(dir, "0"), dir / "out.txt");
  int port = 0;
  REQUIRE_MESSAGE(eventually([&] { return (port = printed_port(*p)) > 0; }, 20s), p->text());

  // Both workers have pushed a snapshot with RPC and collective metrics.
  std::string first;
  REQUIRE_MESSAGE(
      eventually(
          [&] {
            first = get(port, "/metrics").body;
            return first.find("troupe_rpc_client_calls_total{rank=\"1\"}") != std::string::npos &&
                   first.find("troupe_rpc_client_calls_total{rank=\"0\"}") != std::string::npos &&
                   first.find("troupe_collective_seconds_bucket{rank=\"1\",op=\"allreduce\"") !=
                       std::string::npos;
          },
          30s),
      first, "\n", p->text());
  const auto a = parse_with_prometheus_client(first, dir);
  INFO(first);
  // The parser strips _total from a counter's family name and keeps it on the samples.
  CHECK(a.types.at("troupe_rpc_client_calls") == "counter");
  CHECK(a.types.at("troupe_rpc_server_calls") == "counter");
  CHECK(a.types.at("troupe_rpc_sent_bytes") == "counter");
  CHECK(a.types.at("troupe_rpc_received_bytes") == "counter");
  CHECK(a.types.at("troupe_rpc_client_latency_seconds") == "histogram");
  CHECK(a.types.at("troupe_rpc_pending_calls") == "gauge");
  CHECK(a.types.at("troupe_rpc_send_queue_bytes") == "gauge");
  CHECK(a.types.at("troupe_collective_seconds") == "histogram");
  CHECK(a.types.at("troupe_collective_calls") == "counter");
  CHECK(a.types.at("troupe_collective_bytes") == "counter");
  CHECK(a.types.at("troupe_collective_queue_depth") == "gauge");
  CHECK(a.types.at("troupe_run_restarts") == "counter");
  CHECK(a.types.at("troupe_run_rendezvous_rounds") == "counter");
  CHECK(a.types.at("troupe_run_workers_running") == "gauge");
  CHECK(a.types.at("troupe_run_membership_nodes") == "gauge");
  CHECK(a.ranks_of("troupe_rpc_client_calls_total") == std::set<std::string>{"0", "1"});
  CHECK(a.ranks_of("troupe_rpc_send_queue_bytes") == std::set<std::string>{"0", "1"});
  CHECK(a.ranks_of("troupe_collective_calls_total") == std::set<std::string>{"0", "1"});
  CHECK(a.sum("troupe_run_workers_running") == 2);
  CHECK(a.sum("troupe_run_membership_nodes") == 1);
  CHECK(a.sum("troupe_run_rendezvous_rounds_total") == 1);
  CHECK(a.sum("troupe_run_restarts_total") == 0);
  CHECK(a.sum("troupe_rpc_client_latency_seconds_count") > 0);
  CHECK(a.sum("troupe_rpc_client_latency_seconds_bucket", "le=+Inf") ==
        a.sum("troupe_rpc_client_latency_seconds_count"));
  // 4096 floats: the 16 KiB size class.
  CHECK(a.sum("troupe_collective_seconds_count", "size=16KiB") > 0);

  // A second scrape, once the workers have pushed again: the counters grew.
  parsed b;
  REQUIRE(eventually(
      [&] {
        b = parse_with_prometheus_client(get(port, "/metrics").body, dir);
        return b.sum("troupe_rpc_client_calls_total") > a.sum("troupe_rpc_client_calls_total") &&
               b.sum("troupe_collective_calls_total", "op=allreduce") >
                   a.sum("troupe_collective_calls_total", "op=allreduce");
      },
      20s));
  CHECK(b.sum("troupe_rpc_server_calls_total") > a.sum("troupe_rpc_server_calls_total"));
  CHECK(b.sum("troupe_rpc_sent_bytes_total") > a.sum("troupe_rpc_sent_bytes_total"));
  CHECK(b.sum("troupe_rpc_received_bytes_total") > a.sum("troupe_rpc_received_bytes_total"));
  CHECK(b.sum("troupe_collective_bytes_total") > a.sum("troupe_collective_bytes_total"));

  // /status names the run, the round and every worker with its pid, state and logs.
  auto status = get(port, "/status");
  REQUIRE(status.status == 200);
  auto j = nlohmann::json::parse(status.body);
  CHECK(j.at("run_id").get<std::string>().size() == 16);
  CHECK(j.at("round") == 0);
  CHECK(j.at("restarts") == 0);
  CHECK(j.at("state") == "running");
  CHECK(j.at("world_size") == 2);
  REQUIRE(j.at("workers").size() == 2);
  std::set<int> ranks;
  for (const auto& w : j.at("workers")) {
    ranks.insert(w.at("rank").get<int>());
    CHECK(alive(static_cast<pid_t>(w.at("pid").get<long>())));
    CHECK(w.at("state") == "running");
    CHECK(w.at("restarts") == 0);
    CHECK(!w.at("host").get<std::string>().empty());
    CHECK(fs::exists(fs::path(w.at("logs").get<std::string>()) / "stderr"));
  }
  CHECK(ranks == std::set<int>{0, 1});

  // troupe-run status prints it as a table.
  auto st = start({troupe_run, "status", "127.0.0.1:" + std::to_string(port)}, dir / "status.txt");
  REQUIRE(st->wait(20s));
  INFO(st->text());
  CHECK(st->exit_code() == 0);
  CHECK(st->text().find("RANK") != std::string::npos);
  CHECK(st->text().find(j.at("run_id").get<std::string>()) != std::string::npos);
  for (const auto& w : j.at("workers"))
    CHECK(st->text().find(std::to_string(w.at("pid").get<long>())) != std::string::npos);

  std::ofstream(dir / "stop") << "stop\n";
  REQUIRE(p->wait(60s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);

  // Nothing answers any more: troupe-run status says so.
  auto gone = start({troupe_run, "status", "127.0.0.1:" + std::to_string(port), "--timeout", "2s"},
                    dir / "gone.txt");
  REQUIRE(gone->wait(20s));
  CHECK(gone->exit_code() == 1);
  CHECK(gone->text().find("cannot connect to http://127.0.0.1:" + std::to_string(port)) !=
        std::string::npos);
}

TEST_CASE("after a worker fails and the group restarts, /metrics and /status count the restart") {
  auto dir = fresh_dir("metrics-restart");
  auto args = job(dir, "0", {"--max-restarts", "1"});
  args.push_back("--fail-first");
  auto p = start(args, dir / "out.txt");
  int port = 0;
  REQUIRE_MESSAGE(eventually([&] { return (port = printed_port(*p)) > 0; }, 20s), p->text());
  // The restarted workers report, as the second attempt of the run.
  nlohmann::json j;
  REQUIRE_MESSAGE(eventually(
                      [&] {
                        auto r = get(port, "/status");
                        if (r.status != 200) return false;
                        j = nlohmann::json::parse(r.body);
                        return j.at("restarts") == 1 && j.at("workers_running") == 2;
                      },
                      30s),
                  p->text());
  CHECK(j.at("attempt") == 1);
  CHECK(j.at("rounds") == 2);
  for (const auto& w : j.at("workers")) {
    CHECK(w.at("restarts") == 1);
    CHECK(w.at("state") == "running");
    CHECK(w.at("logs").get<std::string>().find("attempt_1") != std::string::npos);
  }
  std::string text;
  REQUIRE(eventually(
      [&] {
        text = get(port, "/metrics").body;
        return text.find("troupe_rpc_client_calls_total{rank=\"1\"}") != std::string::npos;
      },
      30s));
  const auto m = parse_with_prometheus_client(text, dir);
  INFO(text);
  CHECK(m.sum("troupe_run_restarts_total") == 1);
  CHECK(m.sum("troupe_run_rendezvous_rounds_total") == 2);
  CHECK(m.sum("troupe_run_workers_running") == 2);
  std::ofstream(dir / "stop") << "stop\n";
  REQUIRE(p->wait(60s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
}

TEST_CASE("a stuck or oversized client does not keep the endpoint from answering others") {
  auto dir = fresh_dir("metrics-bounds");
  auto p = start(job(dir, "0"), dir / "out.txt");
  int port = 0;
  REQUIRE_MESSAGE(eventually([&] { return (port = printed_port(*p)) > 0; }, 20s), p->text());
  // A client that connects and never sends, and one that sends half a request.
  int silent = dial(port);
  REQUIRE(silent >= 0);
  int half = dial(port);
  REQUIRE(half >= 0);
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  REQUIRE(::send(half, partial.data(), partial.size(), MSG_NOSIGNAL) > 0);
  CHECK(get(port, "/status").status == 200);
  CHECK(get(port, "/nothing").status == 404);
  CHECK(
      http_exchange(port, "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").status ==
      405);
  // Headers above the limit are refused with 413.
  const std::string big =
      "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(16 * 1024, 'a') + "\r\n\r\n";
  CHECK(http_exchange(port, big).status == 413);
  // The stuck clients are cut off by the server's timeout (5 s): their reads end with the
  // server's close, well before this client's own 20 s receive timeout.
  timeval tv{20, 0};
  ::setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  const auto n = ::recv(silent, &c, 1, 0);
  const int err = errno;
  CHECK((n == 0 || (n < 0 && err == ECONNRESET)));
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);
  ::close(silent);
  ::close(half);
  std::ofstream(dir / "stop") << "stop\n";
  REQUIRE(p->wait(60s));
  CHECK(p->exit_code() == 0);
}

TEST_CASE("a metrics port in use stops troupe-run at start with a message naming the port") {
  auto dir = fresh_dir("metrics-port-in-use");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  auto p = start(job(dir, port), dir / "out.txt");
  REQUIRE(p->wait(20s));
  ::close(fd);
  INFO(p->text());
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--metrics-port " + port + ": port " + port +
                       " on 127.0.0.1 is already in use") != std::string::npos);
  CHECK(p->text().find("or 0 to let troupe-run pick one") != std::string::npos);
  CHECK(p->text().find("workers running") == std::string::npos);  // nothing was started
}

TEST_CASE("a metrics port that is not a port is refused like every bad flag") {
  auto dir = fresh_dir("metrics-bad-port");
  auto p = start(job(dir, "http"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--metrics-port") != std::string::npos);
}
