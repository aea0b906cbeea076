// troupe-run as a torchrun user meets it: float-second durations, PET_* variables, the
// torchrun flags it accepts, fresh run ids, early program checks, and troupe-store's exit
// codes. Each runs the real binaries.
#include <cstdlib>
#include <set>

#include <troupe/core/error_file.hpp>
#include <troupe/launcher/config.hpp>
#include "process_helpers.hpp"

using namespace launcher_test;

namespace {

const std::string troupe_run = TROUPE_RUN_BINARY;
const std::string troupe_store = TROUPE_STORE_BINARY;
const std::string worker = TROUPE_LAUNCHER_TEST_WORKER;

std::vector<std::string> standalone(const fs::path& dir, std::vector<std::string> extra,
                                    const std::string& mode = "env") {
  std::vector<std::string> args{
      troupe_run, "--standalone", "--log-dir", (dir / "logs").string(), "--stop-grace", "2s"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {worker, mode, dir.string()});
  return args;
}

// Sets an environment variable for the lifetime of the object (the tests run one thread).
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("durations take torchrun's float seconds as well as units") {
  auto dir = fresh_dir("dropin-float");
  auto p = start(standalone(dir, {"--nproc-per-node", "2", "--monitor-interval", "0.1",
                                  "--rdzv-conf", "timeout=2.5,last_call_timeout=0.5s"}),
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
  CHECK(records_of_round(dir, 0).size() == 2);
}

TEST_CASE("a zero monitor interval is refused with one consistent reason") {
  auto dir = fresh_dir("dropin-zero");
  auto p = start(standalone(dir, {"--monitor-interval", "0"}), dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(has(p->text(), "it must be positive"));
}

TEST_CASE("flags are read from PET_ variables and the command line wins") {
  auto dir = fresh_dir("dropin-pet");
  {
    scoped_env nproc("PET_NPROC_PER_NODE", "3");
    scoped_env role("PET_ROLE", "trainer");
    auto p = start(standalone(dir, {}), dir / "out.txt");
    REQUIRE(p->wait(20s));
    INFO(p->text());
    REQUIRE(p->exit_code() == 0);
    auto recs = records_of_round(dir, 0);
    REQUIRE(recs.size() == 3);
    CHECK(recs.at(0).at("ROLE_NAME") == "trainer");
  }
  auto dir2 = fresh_dir("dropin-pet-cli");
  scoped_env nproc("PET_NPROC_PER_NODE", "3");
  auto p = start(standalone(dir2, {"--nproc-per-node", "2"}), dir2 / "out.txt");
  REQUIRE(p->wait(20s));
  REQUIRE(p->exit_code() == 0);
  CHECK(records_of_round(dir2, 0).size() == 2);
}

TEST_CASE("a bad PET_ value is refused naming the flag") {
  auto dir = fresh_dir("dropin-pet-bad");
  scoped_env nnodes("PET_NNODES", "4:2");
  auto p = start(standalone(dir, {}), dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(has(p->text(), "--nnodes: '4:2'"));
}

TEST_CASE(
    "--version prints the version and torchrun's --no-python and --start-method are accepted") {
  auto dir = fresh_dir("dropin-version");
  auto v = start({troupe_run, "--version"}, dir / "version.txt");
  REQUIRE(v->wait(10s));
  CHECK(v->exit_code() == 0);
  CHECK(has(v->text(), "troupe-run 0."));

  auto p = start(standalone(dir, {"--no-python", "--start-method", "fork", "--no_python"}),
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);

  auto bad = start(standalone(dir, {"--start-method", "thread"}), dir / "bad.txt");
  REQUIRE(bad->wait(10s));
  CHECK(bad->exit_code() == 2);
  CHECK(has(bad->text(), "--start-method: 'thread'"));
}

TEST_CASE("--local-ranks-filter keeps the other ranks' output off the console but in the logs") {
  auto dir = fresh_dir("dropin-filter");
  auto p = start(standalone(dir, {"--nproc-per-node", "3", "--local-ranks-filter", "1"}),
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  const auto text = p->text();
  INFO(text);
  REQUIRE(p->exit_code() == 0);
  CHECK(has(text, "[1]: worker rank 1 started"));
  CHECK_FALSE(has(text, "worker rank 0 started"));
  CHECK_FALSE(has(text, "worker rank 2 started"));
  auto run_id = records_of_round(dir, 0).at(0).at("TROUPE_RUN_ID");
  std::ifstream log(dir / "logs" / run_id / "attempt_0" / "2" / "stdout");
  std::string line;
  std::getline(log, line);
  CHECK(line == "worker rank 2 started");
}

TEST_CASE("runs without an id get fresh ids and the start line names the id and log folder") {
  std::set<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    auto dir = fresh_dir("dropin-id" + std::to_string(i));
    const auto logs = (dir / "logs").string();
    auto p =
        start({troupe_run, "--nproc-per-node", "1", "--log-dir", logs, worker, "env", dir.string()},
              dir / "out.txt");
    REQUIRE(p->wait(20s));
    const auto text = p->text();
    INFO(text);
    REQUIRE(p->exit_code() == 0);
    auto run_id = records_of_round(dir, 0).at(0).at("TROUPE_RUN_ID");
    CHECK(run_id != "none");
    CHECK(has(text, "run id " + run_id + ", logs in " + logs + "/" + run_id));
    ids.insert(run_id);
  }
  CHECK(ids.size() == 2);
}

TEST_CASE("a job of several nodes without an id is refused, saying the nodes must share one") {
  auto dir = fresh_dir("dropin-noid");
  auto p = start({troupe_run, "--nnodes", "2", "--rdzv-backend", "store", "--rdzv-endpoint",
                  "127.0.0.1:1", worker, "env", dir.string()},
                 dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(has(p->text(), "same --rdzv-id"));
}

TEST_CASE("a missing program fails before the rendezvous with exit code 2") {
  auto dir = fresh_dir("dropin-noprog");
  // A node of a two-node job: were the program checked only after the rendezvous, this run
  // would wait for the second node until the join timeout.
  auto p = start(
      {troupe_run, "--nnodes", "2", "--rdzv-backend", "store", "--rdzv-endpoint", "127.0.0.1:1",
       "--rdzv-id", "j", "--rdzv-conf", "timeout=60s", "no-such-program-anywhere"},
      dir / "out.txt");
  REQUIRE(p->wait(30s));
  CHECK(p->exit_code() == 2);
  CHECK(has(p->text(), "'no-such-program-anywhere' is not found on PATH"));

  const auto file = dir / "not-executable";
  { std::ofstream(file) << "#!/bin/sh\n"; }
  auto q = start({troupe_run, "--standalone", file.string()}, dir / "out2.txt");
  REQUIRE(q->wait(30s));
  CHECK(q->exit_code() == 2);
  CHECK(has(q->text(), "is not executable"));
}

TEST_CASE("a program found on PATH runs") {
  auto dir = fresh_dir("dropin-path");
  auto p = start({troupe_run, "--standalone", "--log-dir", (dir / "logs").string(), "true"},
                 dir / "out.txt");
  REQUIRE(p->wait(20s));
  INFO(p->text());
  CHECK(p->exit_code() == 0);
}

TEST_CASE("an unknown --rdzv-conf key is refused listing every known key") {
  auto dir = fresh_dir("dropin-conf");
  auto p = start(standalone(dir, {"--rdzv-conf", "colour=red"}), dir / "out.txt");
  REQUIRE(p->wait(10s));
  const auto text = p->text();
  INFO(text);
  CHECK(p->exit_code() == 2);
  CHECK(has(text, "unknown key 'colour'"));
  REQUIRE(!troupe::launcher::rdzv_conf_keys().empty());
  for (const auto& key : troupe::launcher::rdzv_conf_keys())
    CHECK_MESSAGE(has(text, std::string(key.name)), key.name);
  CHECK(has(text, "heartbeat_timeout"));
}

TEST_CASE(
    "etcd endpoints: http:// and https:// are accepted, and etcd's TLS keys need the etcd "
    "backend and files that exist") {
  auto dir = fresh_dir("dropin-etcd");
  auto p = start({troupe_run, "--rdzv-backend", "store", "--rdzv-endpoint", "https://127.0.0.1:1",
                  "--rdzv-id", "j", worker, "env", dir.string()},
                 dir / "out.txt");
  REQUIRE(p->wait(10s));
  CHECK(p->exit_code() == 2);
  CHECK(has(p->text(), "TLS"));
  CHECK(has(p->text(), "--rdzv-backend etcd"));

  auto missing = start(
      {troupe_run, "--rdzv-backend", "etcd", "--rdzv-endpoint", "https://127.0.0.1:1", "--rdzv-id",
       "j", "--rdzv-conf", "cacert=/nonexistent/ca.pem", worker, "env", dir.string()},
      dir / "missing.txt");
  REQUIRE(missing->wait(10s));
  CHECK(missing->exit_code() == 2);
  CHECK(has(missing->text(), "/nonexistent/ca.pem"));

  auto wrong_backend =
      start({troupe_run, "--rdzv-backend", "store", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id",
             "j", "--rdzv-conf", "user=trainer", worker, "env", dir.string()},
            dir / "wrong.txt");
  REQUIRE(wrong_backend->wait(10s));
  CHECK(wrong_backend->exit_code() == 2);
  CHECK(has(wrong_backend->text(), "applies to --rdzv-backend etcd only"));

  // An https endpoint nobody serves: refused within the join timeout, naming it.
  auto tls = start({troupe_run, "--rdzv-backend", "etcd", "--rdzv-endpoint", "https://127.0.0.1:1",
                    "--rdzv-id", "j", "--rdzv-conf", "timeout=3s", worker, "env", dir.string()},
                   dir / "tls.txt");
  REQUIRE(tls->wait(25s));
  CHECK(tls->exit_code() == 1);
  CHECK(has(tls->text(), "127.0.0.1:1"));

  // Nothing listens on port 1: the join timeout of 3s bounds the attempt.
  const auto t0 = std::chrono::steady_clock::now();
  auto q = start({troupe_run, "--rdzv-backend", "etcd", "--rdzv-endpoint", "http://127.0.0.1:1",
                  "--rdzv-id", "j", "--rdzv-conf", "timeout=3s", worker, "env", dir.string()},
                 dir / "out2.txt");
  REQUIRE(q->wait(25s));
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(q->text());
  CHECK(q->exit_code() == 1);
  CHECK(has(q->text(), "127.0.0.1:1"));
  CHECK(took < 20s);  // far below the 30s an unbounded request used to take
}

TEST_CASE("troupe-store exits with troupe-run's codes: 0 for help, 2 for bad usage") {
  auto dir = fresh_dir("dropin-store");
  auto help = start({troupe_store, "--help"}, dir / "help.txt");
  REQUIRE(help->wait(10s));
  CHECK(help->exit_code() == 0);
  CHECK(has(help->text(), "--port"));
  auto bogus = start({troupe_store, "--bogus"}, dir / "bogus.txt");
  REQUIRE(bogus->wait(10s));
  CHECK(bogus->exit_code() == 2);
  CHECK(has(bogus->text(), "--bogus"));
  auto range = start({troupe_store, "--io-threads", "999"}, dir / "range.txt");
  REQUIRE(range->wait(10s));
  CHECK(range->exit_code() == 2);
  auto missing = start({troupe_store, "--secret-file", (dir / "nope").string()}, dir / "m.txt");
  REQUIRE(missing->wait(10s));
  CHECK(missing->exit_code() == 2);
}

namespace {

// The process group of each process alive now, by pid (zombies left out).
std::map<pid_t, pid_t> process_groups() {
  std::map<pid_t, pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    pid_t pgrp = 0;
    fields >> state >> ppid >> pgrp;
    if (state != "Z") out[std::stoi(name)] = pgrp;
  }
  return out;
}

}  // namespace

TEST_CASE("SIGKILL to the launcher leaves no process of workers started through a shell") {
  auto dir = fresh_dir("dropin-orphans");
  // Each worker: a shell whose background sleep is a grandchild of troupe-run.
  const std::string script =
      "sleep 100 & echo $! > \"$1/bg.$LOCAL_RANK\"; echo $$ > \"$1/sh.$LOCAL_RANK\"; "
      "exec sleep 100";
  auto p = start({troupe_run, "--standalone", "--nproc-per-node", "2", "--log-dir",
                  (dir / "logs").string(), "sh", "-c", script, "sh", dir.string()},
                 dir / "out.txt");
  auto ready = [&] {
    for (const char* f : {"bg.0", "bg.1", "sh.0", "sh.1"}) {
      std::ifstream in(dir / f);
      std::string pid;
      if (!(in >> pid) || pid.empty()) return false;
    }
    return true;
  };
  REQUIRE(eventually(ready));
  std::set<pid_t> groups;  // each worker leads its own process group
  std::vector<pid_t> pids;
  for (const char* f : {"bg.0", "bg.1", "sh.0", "sh.1"}) {
    std::ifstream in(dir / f);
    pid_t pid = 0;
    in >> pid;
    pids.push_back(pid);
    if (f[0] == 's') groups.insert(pid);
  }
  for (pid_t pid : pids) REQUIRE(alive(pid));
  std::size_t before = 0;
  for (const auto& [pid, pgrp] : process_groups()) before += groups.count(pgrp);
  CHECK(before >= 4);  // the shells, their sleeps and the watchdogs

  ::kill(p->pid, SIGKILL);
  REQUIRE(p->wait(10s));
  // Within 2 seconds nothing of the job remains: no process in the workers' groups.
  const bool gone = eventually(
      [&] {
        for (const auto& [pid, pgrp] : process_groups())
          if (groups.count(pgrp) != 0) return false;
        return true;
      },
      2s);
  std::string left;
  for (const auto& [pid, pgrp] : process_groups())
    if (groups.count(pgrp) != 0) left += std::to_string(pid) + " ";
  CHECK_MESSAGE(gone, "left running: ", left);
  for (pid_t pid : pids) CHECK_MESSAGE(!alive(pid), "process ", pid, " survived");
  // Leave nothing behind even if the check failed.
  for (pid_t g : groups) ::kill(-g, SIGKILL);
}

TEST_CASE("a failing worker's error file reaches troupe-run's failure report") {
  auto dir = fresh_dir("dropin-errfile");
  auto p = start(standalone(dir, {"--nproc-per-node", "2"}, "throw"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  const auto text = p->text();
  INFO(text);
  CHECK(p->exit_code() == 1);
  auto recs = records_of_round(dir, 0);  // rank 0 may be stopped before it records
  REQUIRE(recs.count(1) == 1);
  const auto run_id = recs.at(1).at("TROUPE_RUN_ID");
  const auto file = dir / "logs" / run_id / "attempt_0" / "1" / "error.json";
  CHECK(recs.at(1).at("TROUPE_ERROR_FILE") == file.string());
  CHECK(recs.at(1).at("TORCHELASTIC_ERROR_FILE") == file.string());
  REQUIRE(fs::exists(file));
  CHECK_FALSE(fs::exists(dir / "logs" / run_id / "attempt_0" / "0" / "error.json"));
  // torchrun's layout, read back.
  std::ifstream in(file);
  std::stringstream json;
  json << in.rdbuf();
  CHECK(has(json.str(), "{\"message\": {\"message\": \"uncaught exception: rank 1: the loss"));
  CHECK(has(json.str(), "\"py_callstack\""));
  CHECK(has(json.str(), "\"timestamp\""));
  auto content = troupe::read_error_file(file.string());
  CHECK(content.message == "uncaught exception: rank 1: the loss became NaN");
  CHECK(std::strtoll(content.timestamp.c_str(), nullptr, 10) > 1'600'000'000);
  // The report quotes it.
  CHECK(has(text, "--- root cause (" + file.string()));
  CHECK(has(text, "uncaught exception: rank 1: the loss became NaN"));
}
