// troupe-run with real worker processes on one node: environments, restarts, giving up,
// and no worker left behind when the launcher is stopped or killed.
#include <fstream>
#include <set>
#include <sstream>

#include "process_helpers.hpp"

using namespace launcher_test;

namespace {

const std::string troupe_run = TROUPE_RUN_BINARY;
const std::string worker = TROUPE_LAUNCHER_TEST_WORKER;

std::vector<std::string> standalone(const fs::path& dir, const std::string& nproc,
                                    std::vector<std::string> extra, const std::string& mode) {
  std::vector<std::string> args{troupe_run,  "--standalone",          "--nproc-per-node", nproc,
                                "--log-dir", (dir / "logs").string(), "--stop-grace",     "2s"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {worker, mode, dir.string()});
  return args;
}

}  // namespace

TEST_CASE("four workers on one node see correct and distinct environments") {
  auto dir = fresh_dir("env");
  auto p = start(standalone(dir, "4", {}, "env"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  REQUIRE(p->exit_code() == 0);
  auto recs = records_of_round(dir, 0);
  REQUIRE(recs.size() == 4);
  std::set<std::string> pids;
  for (const auto& [rank, r] : recs) {
    CHECK(r.at("RANK") == std::to_string(rank));
    CHECK(r.at("LOCAL_RANK") == std::to_string(rank));
    CHECK(r.at("ROLE_RANK") == std::to_string(rank));
    CHECK(r.at("GROUP_RANK") == "0");
    CHECK(r.at("WORLD_SIZE") == "4");
    CHECK(r.at("LOCAL_WORLD_SIZE") == "4");
    CHECK(r.at("ROLE_WORLD_SIZE") == "4");
    CHECK(r.at("ROLE_NAME") == "default");
    CHECK(r.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(r.at("MASTER_PORT") == recs.at(0).at("MASTER_PORT"));
    CHECK(std::stoi(r.at("MASTER_PORT")) > 0);
    CHECK(r.at("TROUPE_RESTART_COUNT") == "0");
    CHECK(r.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(r.at("TROUPE_MAX_RESTARTS") == "0");
    CHECK(r.at("TROUPE_RUN_ID").size() == 16);
    CHECK(r.at("TORCHELASTIC_RUN_ID") == r.at("TROUPE_RUN_ID"));
    CHECK(r.at("TROUPE_RUN_ID") == recs.at(0).at("TROUPE_RUN_ID"));
    CHECK(r.at("TROUPE_STORE_URL").rfind("tcp://127.0.0.1:", 0) == 0);
    CHECK(r.at("TROUPE_LOCAL_ADDR") == "127.0.0.1");  // --standalone stays on loopback
    if (std::getenv("OMP_NUM_THREADS") == nullptr) CHECK(r.at("OMP_NUM_THREADS") == "1");
    pids.insert(r.at("PID"));
  }
  CHECK(pids.size() == 4);
  // Console lines carry the rank; logs sit where the issue says.
  CHECK(p->text().find("[2]: worker rank 2 started") != std::string::npos);
  const auto run_id = recs.at(0).at("TROUPE_RUN_ID");
  CHECK(fs::exists(dir / "logs" / run_id / "attempt_0" / "3" / "stdout"));
  CHECK(fs::exists(dir / "logs" / run_id / "attempt_0" / "3" / "stderr"));
}

TEST_CASE("redirected streams reach only the log files") {
  auto dir = fresh_dir("redirect");
  auto p = start(standalone(dir, "2", {"--redirects", "1"}, "env"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  REQUIRE(p->exit_code() == 0);
  CHECK(p->text().find("worker rank 0 started") == std::string::npos);
  auto run_id = records_of_round(dir, 0).at(0).at("TROUPE_RUN_ID");
  std::ifstream log(dir / "logs" / run_id / "attempt_0" / "1" / "stdout");
  std::string line;
  std::getline(log, line);
  CHECK(line == "worker rank 1 started");
}

TEST_CASE("a worker that fails on the first attempt causes one restart and the job then succeeds") {
  auto dir = fresh_dir("restart");
  auto p = start(standalone(dir, "3", {"--max-restarts", "2"}, "fail-first"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
  auto first = records_of_round(dir, 0);
  auto second = records_of_round(dir, 1);
  CHECK(records_of_round(dir, 2).empty());
  REQUIRE(second.size() == 3);
  for (const auto& [rank, r] : second) {
    CHECK(r.at("TROUPE_RESTART_COUNT") == "1");
    CHECK(r.at("TROUPE_MAX_RESTARTS") == "2");
    CHECK(r.at("WORLD_SIZE") == "3");
  }
  CHECK(p->text().find("worker rank 1 (local rank 1") != std::string::npos);
  CHECK(p->text().find("failing on purpose on attempt 0") != std::string::npos);
}

TEST_CASE("when restarts are exhausted troupe-run exits non-zero and reports the failing rank") {
  auto dir = fresh_dir("exhaust");
  auto p = start(standalone(dir, "2", {"--max-restarts", "1"}, "fail"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  const auto text = p->text();
  INFO(text);
  CHECK(p->exit_code() == 1);
  CHECK(records_of_round(dir, 1).count(0) == 1);  // the one restart happened
  CHECK(text.find("giving up") != std::string::npos);
  CHECK(text.find("failed on attempt 1: exit code 7") != std::string::npos);
  CHECK(text.find("worker rank 0") != std::string::npos);
  CHECK(text.find("fatal: rank 0 cannot go on") != std::string::npos);
}

namespace {

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE(
    "with --failure-policy replace a killed worker is replaced alone and joins the running job") {
  auto dir = fresh_dir("replace");
  const auto t0 = std::chrono::steady_clock::now();
  auto p =
      start(standalone(dir, "3", {"--max-restarts", "2", "--failure-policy", "replace"}, "elastic"),
            dir / "out.txt");
  REQUIRE(p->wait(40s));
  const auto took = std::chrono::steady_clock::now() - t0;
  const auto text = p->text();
  INFO(text);
  REQUIRE(p->exit_code() == 0);
  // The others ran once: no restart record, and troupe-run said it replaced only rank 1.
  CHECK(fs::exists(dir / "elastic.rank0.restart0"));
  CHECK(fs::exists(dir / "elastic.rank2.restart0"));
  CHECK_FALSE(fs::exists(dir / "elastic.rank0.restart1"));
  CHECK_FALSE(fs::exists(dir / "elastic.rank2.restart1"));
  REQUIRE(fs::exists(dir / "elastic.rank1.restart0"));
  REQUIRE(fs::exists(dir / "elastic.rank1.restart1"));
  CHECK(text.find("replacing worker rank 1 (replacement 1 of 2); the other workers run on") !=
        std::string::npos);
  CHECK(text.find("restarting the worker group") == std::string::npos);
  for (const auto& [rank, r] : records_of_round(dir, 0)) CHECK(r.at("TROUPE_ELASTIC") == "1");
  // troupe-run took the dead worker out of the membership at once (the heartbeat timeout
  // is 60 s), and the replacement, a new process under the same name, is in epoch 5.
  const auto history = file_text(dir / "history");
  INFO(history);
  const auto dead_pid = file_text(dir / "elastic.rank1.restart0");
  const auto new_pid = file_text(dir / "elastic.rank1.restart1");
  CHECK(history.find("dead: worker1 (rank ") != std::string::npos);
  CHECK(history.find("its process ended with signal 9 (SIGKILL), seen by troupe-run") !=
        std::string::npos);
  const auto five = history.substr(history.find("number 5\n"));
  CHECK(five.find("member worker1 ") != std::string::npos);
  CHECK(five.find(" " + new_pid.substr(0, new_pid.size() - 1) + " ") != std::string::npos);
  CHECK(five.find(" " + dead_pid.substr(0, dead_pid.size() - 1) + " ") == std::string::npos);
  CHECK(took < 30s);
}

TEST_CASE("an unknown --failure-policy is refused with both valid values named") {
  auto dir = fresh_dir("policy");
  auto p = start({troupe_run, "--failure-policy", "respawn", worker, "env", dir.string()},
                 dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--failure-policy: 'respawn' is not valid; write restart") !=
        std::string::npos);
  CHECK(p->text().find("or replace") != std::string::npos);
}

TEST_CASE("a usage error names the flag and exits with code 2") {
  auto dir = fresh_dir("usage");
  auto p = start({troupe_run, "--nnodes", "4:2", worker, "env", dir.string()}, dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--nnodes: '4:2'") != std::string::npos);
}

namespace {

// Starts 3 waiting workers, stops the launcher with `sig`, and checks that no worker
// survives it.
void stop_launcher_with(int sig) {
  auto dir = fresh_dir("signal" + std::to_string(sig));
  auto p = start(standalone(dir, "3", {}, "wait"), dir / "out.txt");
  REQUIRE(eventually([&] { return records_of_round(dir, 0).size() == 3; }));
  std::vector<pid_t> pids;
  for (const auto& [rank, r] : records_of_round(dir, 0)) pids.push_back(std::stoi(r.at("PID")));
  for (pid_t pid : pids) REQUIRE(alive(pid));
  ::kill(p->pid, sig);
  REQUIRE(p->wait(15s));
  INFO(p->text());
  if (sig == SIGTERM) CHECK(p->exit_code() == 128 + SIGTERM);
  for (pid_t pid : pids)
    CHECK_MESSAGE(eventually([&] { return !alive(pid); }, 10s), "worker ", pid, " survived");
}

}  // namespace

TEST_CASE("SIGTERM to the launcher leaves no worker behind") { stop_launcher_with(SIGTERM); }

TEST_CASE("SIGKILL to the launcher leaves no worker behind") { stop_launcher_with(SIGKILL); }

TEST_CASE("a worker program that cannot be executed is reported by name") {
  auto dir = fresh_dir("noexec");
  auto p = start({troupe_run, "--standalone", "--log-dir", (dir / "logs").string(),
                  "no-such-program-anywhere", "x"},
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("the worker program 'no-such-program-anywhere' is not found on PATH") !=
        std::string::npos);
}
