// Several troupe-run processes acting as the nodes of one job: through a real etcd on
// loopback, and through a TCP store hosted by one of them.
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>

#include "process_helpers.hpp"
#include "support/etcd_server.hpp"
#include "support/skip.hpp"
#include "support/test_pki.hpp"

using namespace launcher_test;
using troupe::test::etcd_server;
using troupe::test::test_pki;

namespace {

const std::string troupe_run = TROUPE_RUN_BINARY;
const std::string worker = TROUPE_LAUNCHER_TEST_WORKER;

std::vector<std::string> node_args(const fs::path& dir, const std::string& nnodes,
                                   const std::string& backend, const std::string& endpoint,
                                   const std::string& id, const std::string& mode,
                                   std::vector<std::string> extra = {},
                                   const std::string& conf = "") {
  std::vector<std::string> args{troupe_run,
                                "--nnodes",
                                nnodes,
                                "--nproc-per-node",
                                "2",
                                "--rdzv-backend",
                                backend,
                                "--rdzv-endpoint",
                                endpoint,
                                "--rdzv-id",
                                id,
                                "--log-dir",
                                (dir / "logs").string(),
                                "--stop-grace",
                                "2s",
                                "--rdzv-conf",
                                "timeout=20s,last_call_timeout=300ms" + conf};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {worker, mode, dir.string()});
  return args;
}

// Checks that `recs` form one world of `world` workers on world / 2 nodes.
void check_world(const std::map<int, record>& recs, int world) {
  REQUIRE(recs.size() == static_cast<std::size_t>(world));
  std::set<std::string> groups;
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("RANK") == std::to_string(rank));
    CHECK(r.at("WORLD_SIZE") == std::to_string(world));
    CHECK(r.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(r.at("GROUP_WORLD_SIZE") == std::to_string(world / 2));
    CHECK(std::stoi(r.at("RANK")) ==
          2 * std::stoi(r.at("GROUP_RANK")) + std::stoi(r.at("LOCAL_RANK")));
    CHECK(r.at("MASTER_ADDR") == recs.begin()->second.at("MASTER_ADDR"));
    CHECK(r.at("MASTER_PORT") == recs.begin()->second.at("MASTER_PORT"));
    groups.insert(r.at("GROUP_RANK"));
  }
  CHECK(groups.size() == static_cast<std::size_t>(world / 2));
}

// The first round, of the first ten, whose records number `size`, or -1. Three launchers
// started together may still meet in two rounds (two, then the third arriving after the
// last call), so a test waiting for the full world accepts whichever round holds it.
int round_of_size(const fs::path& dir, std::size_t size) {
  for (int round = 0; round < 10; ++round)
    if (records_of_round(dir, round).size() == size) return round;
  return -1;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("two launchers rendezvous through etcd into one world of twice their workers") {
  auto* etcd = etcd_server::shared();
  if (etcd == nullptr) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto dir = fresh_dir("etcd2");
  const std::string id = "two-nodes-" + std::to_string(::getpid());
  auto a = start(node_args(dir, "2", "etcd", etcd->endpoint(), id, "env"), dir / "a.txt");
  auto b = start(node_args(dir, "2", "etcd", etcd->endpoint(), id, "env"), dir / "b.txt");
  REQUIRE(a->wait(25s));
  REQUIRE(b->wait(25s));
  INFO(a->text());
  INFO(b->text());
  CHECK(a->exit_code() == 0);
  CHECK(b->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  check_world(recs, 4);
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("TROUPE_RUN_ID") == id);
    CHECK(r.at("TROUPE_STORE_URL") == "etcd://" + etcd->endpoint());
  }
}

TEST_CASE(
    "two launchers rendezvous through an https etcd that wants client certificates, and "
    "their workers meet in its store") {
  if (!etcd_server::available()) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  if (!test_pki::available()) TROUPE_SKIP_TEST(test_pki::skip_reason());
  auto pki = test_pki::make();
  REQUIRE_MESSAGE(pki.has_value(), (pki ? "" : pki.error().to_string()));
  troupe::test::etcd_server_options eo;
  eo.cert_file = (*pki)->server_cert();
  eo.key_file = (*pki)->server_key();
  eo.client_ca_file = (*pki)->ca();
  auto etcd = etcd_server::start(eo);
  REQUIRE_MESSAGE(etcd.has_value(), (etcd ? "" : etcd.error().to_string()));
  auto dir = fresh_dir("etcd-tls");
  const std::string id = "tls-nodes-" + std::to_string(::getpid());
  // As a user writes it: the https:// client URL and torchrun's TLS keys.
  const std::string conf =
      ",cacert=" + (*pki)->ca() + ",cert=" + (*pki)->client_cert() + ",key=" + (*pki)->client_key();
  auto a = start(node_args(dir, "2", "etcd", (*etcd)->url(), id, "store", {}, conf), dir / "a.txt");
  auto b = start(node_args(dir, "2", "etcd", (*etcd)->url(), id, "store", {}, conf), dir / "b.txt");
  REQUIRE(a->wait(40s));
  REQUIRE(b->wait(40s));
  INFO(a->text());
  INFO(b->text());
  CHECK(a->exit_code() == 0);
  CHECK(b->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  check_world(recs, 4);
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("TROUPE_STORE_URL").find("protocol=https") != std::string::npos);
    CHECK(fs::exists(dir / ("store.rank" + std::to_string(rank))));
  }

  // Without a client certificate the launcher stops at once, saying what to give.
  auto refused = start(node_args(dir, "1", "etcd", (*etcd)->url(), id + "-refused", "env", {},
                                 ",cacert=" + (*pki)->ca()),
                       dir / "refused.txt");
  REQUIRE(refused->wait(30s));
  INFO(refused->text());
  CHECK(refused->exit_code() == 1);
  CHECK(refused->text().find("cert=PATH and key=PATH") != std::string::npos);
}

TEST_CASE(
    "a third launcher joining an elastic 2:3 job causes a new round in which the world grows") {
  auto* etcd = etcd_server::shared();
  if (etcd == nullptr) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto dir = fresh_dir("elastic");
  const std::string id = "elastic-" + std::to_string(::getpid());
  auto a = start(node_args(dir, "2:3", "etcd", etcd->endpoint(), id, "wait"), dir / "a.txt");
  auto b = start(node_args(dir, "2:3", "etcd", etcd->endpoint(), id, "wait"), dir / "b.txt");
  REQUIRE_MESSAGE(eventually([&] { return records_of_round(dir, 0).size() == 4; }), a->text(),
                  b->text());
  check_world(records_of_round(dir, 0), 4);

  auto c = start(node_args(dir, "2:3", "etcd", etcd->endpoint(), id, "wait"), dir / "c.txt");
  REQUIRE_MESSAGE(eventually([&] { return records_of_round(dir, 1).size() == 6; }), a->text(),
                  b->text(), c->text());
  check_world(records_of_round(dir, 1), 6);

  std::ofstream(dir / "stop") << "done\n";
  for (auto* p : {a.get(), b.get(), c.get()}) {
    REQUIRE(p->wait(20s));
    INFO(p->text());
    CHECK(p->exit_code() == 0);
  }
}

TEST_CASE("two launchers meet through a TCP store that one of them hosts") {
  auto dir = fresh_dir("store2");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto a = start(node_args(dir, "2", "store", endpoint, "tcp-job", "env", {"--node-rank", "0"}),
                 dir / "a.txt");
  auto b = start(node_args(dir, "2", "store", endpoint, "tcp-job", "env", {"--node-rank", "1"},
                           ",is_host=false"),
                 dir / "b.txt");
  REQUIRE(a->wait(25s));
  REQUIRE(b->wait(25s));
  INFO(a->text());
  INFO(b->text());
  CHECK(a->exit_code() == 0);
  CHECK(b->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  check_world(recs, 4);
  // --node-rank orders the nodes.
  CHECK(recs.at(0).at("GROUP_RANK") == "0");
  CHECK(recs.at(3).at("GROUP_RANK") == "1");
}

TEST_CASE("a launcher leaving an elastic 2:3 job causes a new round in which the world shrinks") {
  auto* etcd = etcd_server::shared();
  if (etcd == nullptr) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto dir = fresh_dir("shrink");
  const std::string id = "shrink-" + std::to_string(::getpid());
  std::vector<std::unique_ptr<launcher_process>> nodes;
  for (const char* name : {"a.txt", "b.txt", "c.txt"})
    nodes.push_back(start(node_args(dir, "2:3", "etcd", etcd->endpoint(), id, "wait"), dir / name));
  REQUIRE_MESSAGE(eventually([&] { return round_of_size(dir, 6) >= 0; }), nodes[0]->text(),
                  nodes[1]->text(), nodes[2]->text());
  const int full = round_of_size(dir, 6);
  check_world(records_of_round(dir, full), 6);

  ::kill(nodes[2]->pid, SIGTERM);
  REQUIRE(nodes[2]->wait(15s));
  CHECK(nodes[2]->exit_code() == 128 + SIGTERM);
  REQUIRE_MESSAGE(eventually([&] { return records_of_round(dir, full + 1).size() == 4; }),
                  nodes[0]->text(), nodes[1]->text());
  check_world(records_of_round(dir, full + 1), 4);

  std::ofstream(dir / "stop") << "done\n";
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(nodes[i]->wait(20s));
    INFO(nodes[i]->text());
    CHECK(nodes[i]->exit_code() == 0);
  }
}

TEST_CASE("the node hosting the store stays until the other node's workers are done") {
  auto dir = fresh_dir("barrier");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto host = start(node_args(dir, "2", "store", endpoint, "barrier-job", "env",
                              {"--node-rank", "0"}, ",is_host=true"),
                    dir / "host.txt");
  auto other = start(node_args(dir, "2", "store", endpoint, "barrier-job", "wait",
                               {"--node-rank", "1"}, ",is_host=false"),
                     dir / "other.txt");
  REQUIRE_MESSAGE(eventually([&] {
                    return host->text().find("finished successfully") != std::string::npos &&
                           records_of_round(dir, 0).size() == 4;
                  }),
                  host->text(), other->text());
  CHECK_FALSE(host->proc.exited());  // still there for the other
  std::ofstream(dir / "stop") << "done\n";
  REQUIRE(other->wait(20s));
  REQUIRE(host->wait(20s));
  INFO(host->text());
  INFO(other->text());
  CHECK(other->exit_code() == 0);
  CHECK(host->exit_code() == 0);
}

TEST_CASE("a killed launcher in an elastic 2:3 job goes silent and the others re-form without it") {
  auto* etcd = etcd_server::shared();
  if (etcd == nullptr) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto dir = fresh_dir("silent");
  const std::string id = "silent-" + std::to_string(::getpid());
  std::vector<std::unique_ptr<launcher_process>> nodes;
  for (const char* name : {"a.txt", "b.txt", "c.txt"})
    nodes.push_back(start(
        node_args(dir, "2:3", "etcd", etcd->endpoint(), id, "wait", {}, ",heartbeat_timeout=1s"),
        dir / name));
  REQUIRE_MESSAGE(eventually([&] { return round_of_size(dir, 6) >= 0; }), nodes[0]->text(),
                  nodes[1]->text(), nodes[2]->text());
  const int full = round_of_size(dir, 6);

  ::kill(nodes[2]->pid, SIGKILL);  // no goodbye: only its silence tells
  REQUIRE(nodes[2]->wait(15s));
  REQUIRE_MESSAGE(eventually([&] { return records_of_round(dir, full + 1).size() == 4; }),
                  nodes[0]->text(), nodes[1]->text());
  check_world(records_of_round(dir, full + 1), 4);

  std::ofstream(dir / "stop") << "done\n";
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(nodes[i]->wait(20s));
    INFO(nodes[i]->text());
    CHECK(nodes[i]->exit_code() == 0);
  }
}

TEST_CASE("on a job of several nodes the failure report quotes the error file and names the node") {
  auto dir = fresh_dir("errfile-nodes");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto a = start(node_args(dir, "2", "store", endpoint, "errfile-job", "throw",
                           {"--node-rank", "0"}, ",is_host=true"),
                 dir / "a.txt");
  auto b = start(node_args(dir, "2", "store", endpoint, "errfile-job", "throw",
                           {"--node-rank", "1"}, ",is_host=false"),
                 dir / "b.txt");
  REQUIRE(a->wait(30s));
  REQUIRE(b->wait(30s));
  const std::string text = a->text() + b->text();
  INFO(text);
  CHECK(a->exit_code() != 0);
  CHECK(text.find("--- root cause (") != std::string::npos);
  CHECK(text.find("the loss became NaN") != std::string::npos);
  CHECK(text.find(", on node ") != std::string::npos);
  CHECK(text.find(" (group rank ") != std::string::npos);
}

TEST_CASE("an etcd endpoint written as an http:// client URL works") {
  auto* etcd = etcd_server::shared();
  if (etcd == nullptr) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto dir = fresh_dir("etcd-http");
  const std::string id = "http-" + std::to_string(::getpid());
  auto p =
      start(node_args(dir, "1", "etcd", "http://" + etcd->endpoint(), id, "env"), dir / "out.txt");
  REQUIRE(p->wait(30s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
  CHECK(records_of_round(dir, 0).size() == 2);
}

TEST_CASE("each node's workers get its --local-addr, and MASTER_ADDR is rank 0's node's") {
  auto dir = fresh_dir("local-addr");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // 127.0.0.2 is this host's too (all of 127/8 is on the loopback interface): it stands
  // for node 0's address on a network the nodes share.
  auto a = start(node_args(dir, "2", "store", endpoint, "addr-job", "env",
                           {"--node-rank", "0", "--local-addr", "127.0.0.2"}),
                 dir / "a.txt");
  auto b = start(node_args(dir, "2", "store", endpoint, "addr-job", "env", {"--node-rank", "1"},
                           ",is_host=false,local_addr=127.0.0.3"),
                 dir / "b.txt");
  REQUIRE(a->wait(25s));
  REQUIRE(b->wait(25s));
  INFO(a->text());
  INFO(b->text());
  CHECK(a->exit_code() == 0);
  CHECK(b->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  check_world(recs, 4);
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("TROUPE_LOCAL_ADDR") == (rank < 2 ? "127.0.0.2" : "127.0.0.3"));
    CHECK(r.at("MASTER_ADDR") == "127.0.0.2");
  }
}

TEST_CASE("a --local-addr that is not this host's is refused at once, naming the flag") {
  auto dir = fresh_dir("bad-local-addr");
  // 192.0.2.0/24 is reserved for documentation; nothing is sent there: the check is local.
  auto p = start(node_args(dir, "2", "store", "127.0.0.1:9", "bad-addr", "env",
                           {"--local-addr", "192.0.2.123"}),
                 dir / "out.txt");
  REQUIRE(p->wait(10s));
  INFO(p->text());
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--local-addr") != std::string::npos);
  CHECK(p->text().find("not an address of this host") != std::string::npos);
  CHECK(records_of_round(dir, 0).empty());
}

TEST_CASE("a TROUPE_SOCKET_IFNAME that names no interface is refused at once, naming it") {
  auto dir = fresh_dir("bad-ifname");
  // A job across nodes with a routable endpoint: the address is decided (and refused)
  // before anything is sent to the endpoint.
  auto args = node_args(dir, "2", "store", "192.0.2.1:29400", "bad-ifname", "env");
  args.insert(args.begin(), {"/usr/bin/env", "TROUPE_SOCKET_IFNAME=nosuch0"});
  auto p = start(args, dir / "out.txt");
  REQUIRE(p->wait(10s));
  INFO(p->text());
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("TROUPE_SOCKET_IFNAME='nosuch0'") != std::string::npos);
  CHECK(p->text().find("no such interface") != std::string::npos);
}

TEST_CASE("TROUPE_SOCKET_IFNAME is passed on to NCCL and Gloo as their socket interface") {
  auto dir = fresh_dir("ifname");
  auto p = start({"/usr/bin/env", "-u", "NCCL_SOCKET_IFNAME", "-u", "GLOO_SOCKET_IFNAME",
                  "TROUPE_SOCKET_IFNAME=lo", troupe_run, "--standalone", "--nproc-per-node", "2",
                  "--log-dir", (dir / "logs").string(), worker, "env", dir.string()},
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  REQUIRE(p->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  REQUIRE(recs.size() == 2);
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("NCCL_SOCKET_IFNAME") == "lo");
    CHECK(r.at("GLOO_SOCKET_IFNAME") == "lo");
    CHECK(r.at("TROUPE_LOCAL_ADDR") == "127.0.0.1");
  }
}

namespace {

// The members worker `rank` (launcher_test_worker follow) saw last: DIR/members.rank<rank>.
std::set<std::string> members_seen_by(const fs::path& dir, int rank) {
  std::ifstream in(dir / ("members.rank" + std::to_string(rank)));
  std::string number;
  std::string names;
  std::set<std::string> out;
  if (!(in >> number >> names)) return out;
  std::size_t from = 0;
  for (auto comma = names.find(',');; comma = names.find(',', from)) {
    out.insert(names.substr(from, comma - from));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

std::set<std::string> workers_named(int from, int to) {
  std::set<std::string> out;
  for (int i = from; i <= to; ++i) out.insert("worker" + std::to_string(i));
  return out;
}

// The pids of ranks `from`..`to` in round 0's records.
std::map<int, pid_t> pids_of_round0(const fs::path& dir, int from, int to) {
  std::map<int, pid_t> out;
  for (const auto& [rank, r] : records_of_round(dir, 0))
    if (rank >= from && rank <= to) out[rank] = std::stoi(r.at("PID"));
  return out;
}

// Neither of the first two nodes restarted its workers: the same pids still run, no
// worker of a later round was started and no second attempt logged.
void check_not_restarted(const fs::path& dir, const std::string& id,
                         const std::map<int, pid_t>& pids) {
  CHECK(pids_of_round0(dir, 0, 3) == pids);
  for (const auto& [rank, pid] : pids) CHECK_MESSAGE(alive(pid), "worker ", rank, " is gone");
  CHECK(records_of_round(dir, 1).empty());
  CHECK_FALSE(fs::exists(dir / "logs" / id / "attempt_1"));
}

// Tells the workers of `launchers` to finish (DIR/stop) and checks that each launcher then
// exits 0 within 20 s.
void stop_and_expect_success(const fs::path& dir, std::vector<launcher_process*> launchers) {
  std::ofstream(dir / "stop") << "done\n";
  for (auto* p : launchers) {
    REQUIRE(p->wait(20s));
    INFO(p->text());
    CHECK(p->exit_code() == 0);
  }
}

std::vector<std::string> replace_node_args(const fs::path& dir, const std::string& endpoint,
                                           const std::string& id, int node_rank,
                                           const std::string& conf) {
  std::vector<std::string> extra{"--failure-policy", "replace"};
  if (node_rank >= 0) extra.insert(extra.end(), {"--node-rank", std::to_string(node_rank)});
  return node_args(dir, "2:3", "store", endpoint, id, "follow", extra,
                   (node_rank == 0 ? ",is_host=true" : ",is_host=false") + conf);
}

}  // namespace

TEST_CASE(
    "with --failure-policy replace a third launcher's workers join the running job and "
    "leave it on SIGTERM, while the first two launchers' workers run on unrestarted") {
  auto dir = fresh_dir("replace-arrive");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::string id = "replace-arrive";
  auto a = start(replace_node_args(dir, endpoint, id, 0, ""), dir / "a.txt");
  auto b = start(replace_node_args(dir, endpoint, id, 1, ""), dir / "b.txt");
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 3); }),
                  a->text(), b->text());
  const auto pids = pids_of_round0(dir, 0, 3);
  REQUIRE(pids.size() == 4);

  // A third node arrives: its workers take ranks 4 and 5 in the running round 0.
  auto c = start(replace_node_args(dir, endpoint, id, -1, ""), dir / "c.txt");
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 5); }),
                  a->text(), b->text(), c->text());
  // The newcomer's own worker sees the same epoch (it polls the membership on its own).
  CHECK_MESSAGE(eventually([&] { return members_seen_by(dir, 5) == workers_named(0, 5); }),
                c->text());
  CHECK(c->text().find("joined the running job in round 0 as group rank 2 with ranks 4-5") !=
        std::string::npos);
  CHECK_MESSAGE(eventually([&] {
                  return a->text().find("arrived in the running round 0") != std::string::npos;
                }),
                a->text());
  check_not_restarted(dir, id, pids);

  // It leaves: its workers leave the membership, the others run on.
  ::kill(c->pid, SIGTERM);
  REQUIRE(c->wait(15s));
  INFO(c->text());
  CHECK(c->exit_code() == 128 + SIGTERM);
  CHECK(c->text().find("this node left the running job") != std::string::npos);
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 3); }),
                  a->text(), b->text());
  CHECK_MESSAGE(eventually([&] { return b->text().find(") left round 0: ") != std::string::npos; }),
                b->text());
  check_not_restarted(dir, id, pids);

  stop_and_expect_success(dir, {a.get(), b.get()});
}

TEST_CASE(
    "with --failure-policy replace a killed launcher's workers drop out of the membership "
    "within the heartbeat timeout, while the others run on unrestarted") {
  auto dir = fresh_dir("replace-killed");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::string id = "replace-killed";
  // The workers' membership heartbeat: 3 s; the launchers' rendezvous heartbeat: 2 s.
  const auto node = [&](int node_rank, const char* out) {
    auto args = replace_node_args(dir, endpoint, id, node_rank, ",heartbeat_timeout=2s");
    args.insert(args.begin(), {"/usr/bin/env", "TROUPE_HEARTBEAT_TIMEOUT=3s"});
    return start(args, dir / out);
  };
  auto a = node(0, "a.txt");
  auto b = node(1, "b.txt");
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 3); }),
                  a->text(), b->text());
  const auto pids = pids_of_round0(dir, 0, 3);
  REQUIRE(pids.size() == 4);
  auto c = node(-1, "c.txt");
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 5); }),
                  a->text(), b->text(), c->text());
  const auto c_pids = [&] {
    std::vector<pid_t> out;
    for (const auto& [rank, pid] : pids_of_round0(dir, 4, 5)) out.push_back(pid);
    return out;
  }();

  ::kill(c->pid, SIGKILL);  // no goodbye: only the heartbeats tell
  REQUIRE(c->wait(15s));
  for (pid_t pid : c_pids)
    CHECK_MESSAGE(eventually([&] { return !alive(pid); }, 10s), "worker ", pid, " survived");
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE_MESSAGE(eventually([&] { return members_seen_by(dir, 0) == workers_named(0, 3); }),
                  a->text(), b->text());
  CHECK(std::chrono::steady_clock::now() - killed_at < 15s);
  CHECK_MESSAGE(eventually([&] {
                  return a->text().find("left round 0: silent for 2s") != std::string::npos;
                }),
                a->text());
  check_not_restarted(dir, id, pids);

  stop_and_expect_success(dir, {a.get(), b.get()});
}
