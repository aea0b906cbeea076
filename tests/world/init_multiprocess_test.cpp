// troupe::init from every launcher's environment, with real processes on 127.0.0.1: under
// troupe-run, under a torchrun-style and a Slurm-style environment set here (no launcher),
// through a restart, and failing clearly when the store or a setting is wrong.
#include <doctest/doctest.h>

#include <troupe/world/world.hpp>
#include "support/child_process.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using vars = std::map<std::string, std::string>;

const std::string worker = WORLD_TEST_WORKER;
const std::string troupe_run = TROUPE_RUN_BINARY;

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("troupe-init-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// This process's environment without any launcher's variables, plus `extra`.
std::vector<std::string> environment(const vars& extra) {
  std::vector<std::string> out;
  for (char** p = environ; p && *p; ++p) {
    std::string e = *p;
    auto name = e.substr(0, e.find('='));
    if (name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" ||
        name == "LOCAL_WORLD_SIZE" || name == "GROUP_RANK" || name == "MASTER_ADDR" ||
        name == "MASTER_PORT" || name.starts_with("TROUPE_") || name.starts_with("SLURM_") ||
        name.starts_with("TORCHELASTIC_") || name.starts_with("PET_"))
      continue;
    out.push_back(e);
  }
  for (const auto& [k, v] : extra) out.push_back(k + "=" + v);
  return out;
}

// A process with its output in a file (support/child_process.hpp); killed if still
// running at the end.
struct process {
  troupe::test::child_process proc;
  pid_t pid = -1;
  // Waits at most `timeout` (killed after that); true if it exited by itself.
  bool wait(std::chrono::milliseconds timeout) { return proc.wait(timeout); }
  int exit_code() const { return proc.exit_code(); }
  std::string text() const { return proc.output_text(); }
};

std::unique_ptr<process> start(const std::vector<std::string>& args, const vars& env,
                               const fs::path& output) {
  auto p = std::make_unique<process>();
  troupe::test::spawn_options o;
  o.output = output.string();
  o.env = environment(env);  // the whole environment, as the test composes it
  o.replace_env = true;
  p->proc = troupe::test::child_process::start(args, o);
  REQUIRE_MESSAGE(p->proc.started(), p->proc.start_error());
  p->pid = p->proc.pid();
  return p;
}

bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
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

// Starts `world` workers, rank r with env_of(r), and checks that each prints its ok line.
void run_world(const std::string& name, int world, const std::function<vars(int)>& env_of,
               const std::string& launcher) {
  auto dir = fresh_dir(name);
  std::vector<std::unique_ptr<process>> ps;
  for (int r = 0; r < world; ++r)
    ps.push_back(
        start({worker, "--timeout", "30s"}, env_of(r), dir / ("rank" + std::to_string(r))));
  for (int r = 0; r < world; ++r) {
    auto& p = *ps[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(p.wait(60s), "rank ", r, " did not finish: ", p.text());
    INFO("rank ", r, ": ", p.text());
    CHECK(p.exit_code() == 0);
    CHECK(p.text().find("rank " + std::to_string(r) + " of " + std::to_string(world) +
                        ": ok under " + launcher) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("init works under troupe-run: allreduce, RPC and the store on every rank") {
  auto dir = fresh_dir("troupe-run");
  auto p = start({troupe_run, "--standalone", "--nproc-per-node", "3", "--log-dir",
                  (dir / "logs").string(), worker, "--timeout", "30s"},
                 {}, dir / "out");
  REQUIRE(p->wait(90s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
  for (int r = 0; r < 3; ++r)
    CHECK(p->text().find("rank " + std::to_string(r) +
                         " of 3: ok under troupe-run, attempt 0, "
                         "scope 'troupe-run/") != std::string::npos);
  CHECK(p->text().find("address 127.0.0.1") != std::string::npos);
}

TEST_CASE(
    "under troupe-run --failure-policy replace, init makes an elastic world that survives a killed "
    "rank") {
  auto dir = fresh_dir("elastic");
  auto p = start(
      {troupe_run, "--standalone", "--nproc-per-node", "3", "--max-restarts", "1",
       "--failure-policy", "replace", "--log-dir", (dir / "logs").string(), ELASTIC_WORLD_WORKER},
      {}, dir / "out");
  REQUIRE(p->wait(90s));
  const auto text = p->text();
  INFO(text);
  CHECK(p->exit_code() == 0);
  CHECK(text.find("replacing worker rank 1 (replacement 1 of 1)") != std::string::npos);
  CHECK(text.find("restarting the worker group") == std::string::npos);
  // Every member ends in epoch 5 (three joins, the death, the replacement) at size 3; the
  // survivors trained on more than one group, in the same processes.
  for (int r = 0; r < 3; ++r)
    CHECK(text.find("worker" + std::to_string(r) + ": ok, rank ") != std::string::npos);
  CHECK(text.find(" of 3 in epoch 5 after ") != std::string::npos);
  CHECK(text.find("worker0: init rank") != std::string::npos);
  // Rank 0 and 2 initialised once each; rank 1 twice (the killed one and its replacement).
  auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  CHECK(count("worker0: init rank") == 1);
  CHECK(count("worker2: init rank") == 1);
  CHECK(count("worker1: init rank") == 2);
}

TEST_CASE(
    "an elastic world refuses a store it would host itself, saying why, with or without RPC") {
  troupe::init_options o;
  o.elastic = true;
  o.timeout = 5s;
  for (bool rpc : {false, true}) {
    o.rpc = rpc;
    auto alone = troupe::init(o);  // no launcher: this process would host an in-process store
    REQUIRE_FALSE(alone.has_value());
    CHECK(alone.error().code() == troupe::errc::invalid_argument);
    CHECK(alone.error().message().find("needs a store that outlives every worker") !=
          std::string::npos);
  }
}

TEST_CASE("init works under a torchrun-style environment, rank 0 hosting the store") {
  const std::string port = std::to_string(free_port());
  run_world(
      "torchrun", 3,
      [&](int r) {
        return vars{{"RANK", std::to_string(r)},
                    {"LOCAL_RANK", std::to_string(r)},
                    {"WORLD_SIZE", "3"},
                    {"LOCAL_WORLD_SIZE", "3"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", port},
                    {"TORCHELASTIC_RUN_ID", "init-test"},
                    {"TORCHELASTIC_RESTART_COUNT", "0"}};
      },
      "torchrun, attempt 0, scope 'torchrun/init-test/attempt-0'");
}

TEST_CASE("init works under bare RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT") {
  const std::string port = std::to_string(free_port());
  run_world(
      "bare", 2,
      [&](int r) {
        return vars{{"RANK", std::to_string(r)},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "localhost"},
                    {"MASTER_PORT", port}};
      },
      "RANK/WORLD_SIZE, attempt 0, scope ''");
}

TEST_CASE("init works under a Slurm-style environment with the port derived from the job id") {
  // Slurm gives no port: troupe derives 20000 + job id % 20000. Pick a job id whose port is
  // free here (bounded search).
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  int job = -1;
  for (int i = 0; i < 200 && job < 0; ++i) {
    int candidate = 100000 + static_cast<int>(rng() % 20000);
    if (port_free(20000 + candidate % 20000)) job = candidate;
  }
  REQUIRE(job > 0);
  run_world(
      "slurm", 2,
      [&](int r) {
        return vars{{"SLURM_PROCID", std::to_string(r)},
                    {"SLURM_NTASKS", "2"},
                    {"SLURM_LOCALID", std::to_string(r)},
                    {"SLURM_NODEID", "0"},
                    {"SLURM_NNODES", "1"},
                    {"SLURM_JOB_ID", std::to_string(job)},
                    {"SLURM_STEP_NODELIST", "localhost"}};
      },
      "Slurm, attempt 0, scope 'slurm/" + std::to_string(job) + "/attempt-0'");
}

TEST_CASE("under troupe-run, a rank that fails on attempt 0 is restarted and attempt 1 completes") {
  auto dir = fresh_dir("restart");
  auto p = start(
      {troupe_run, "--standalone", "--nproc-per-node", "3", "--max-restarts", "1", "--log-dir",
       (dir / "logs").string(), worker, "--timeout", "30s", "--rank1-fails-first"},
      {}, dir / "out");
  REQUIRE(p->wait(90s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
  CHECK(p->text().find("exiting on attempt 0 on purpose") != std::string::npos);
  for (int r = 0; r < 3; ++r)
    CHECK(p->text().find("rank " + std::to_string(r) + " of 3: ok under troupe-run, attempt 1") !=
          std::string::npos);
}

TEST_CASE("with no store reachable, init fails within its timeout saying where it looked") {
  auto dir = fresh_dir("nostore");
  const std::string port = std::to_string(free_port());
  auto t0 = std::chrono::steady_clock::now();
  auto p = start({worker, "--timeout", "2s"},
                 {{"RANK", "1"},
                  {"WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", port},
                  {"TORCHELASTIC_RUN_ID", "lonely"}},
                 dir / "out");
  REQUIRE(p->wait(60s));
  INFO(p->text());
  CHECK(p->exit_code() == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < 45s);  // 2 s, with room for a loaded machine
  CHECK(p->text().find("no store at 127.0.0.1:" + port + " after 2s") != std::string::npos);
  CHECK(p->text().find("rank 0 hosts it under torchrun-style launch; is rank 0 running, and is "
                       "MASTER_ADDR its address?") != std::string::npos);
}

TEST_CASE(
    "an interface that does not exist, or a MASTER_ADDR that does not resolve, fails at once") {
  auto dir = fresh_dir("bad");
  const vars base{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}};
  auto with = [&](vars extra) {
    extra.insert(base.begin(), base.end());
    return extra;
  };
  struct bad_case {
    vars env;
    std::string says;
  };
  for (const auto& c :
       {bad_case{with({{"MASTER_ADDR", "127.0.0.1"}, {"TROUPE_SOCKET_IFNAME", "nosuch0"}}),
                 "TROUPE_SOCKET_IFNAME='nosuch0'"},
        bad_case{with({{"MASTER_ADDR", "no-such-host.invalid"}}),
                 "MASTER_ADDR='no-such-host.invalid' does not resolve"}}) {
    auto t0 = std::chrono::steady_clock::now();
    auto p = start({worker, "--timeout", "60s"}, c.env, dir / "out");
    REQUIRE(p->wait(60s));
    INFO(p->text());
    CHECK(p->exit_code() == 2);
    CHECK(p->text().find(c.says) != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);  // not the 60 s timeout
  }
}
