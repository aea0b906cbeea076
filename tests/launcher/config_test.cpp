// The launcher's flags and the workers' environment, without starting processes.
#include <doctest/doctest.h>

#include <algorithm>

#include <troupe/launcher/cli.hpp>
#include <troupe/launcher/config.hpp>
#include <troupe/launcher/worker_env.hpp>

using namespace troupe::launcher;

namespace {

cli_outcome parse(std::vector<std::string> args) {
  args.insert(args.begin(), "troupe-run");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

bool error_mentions(const cli_outcome& o, const std::string& text) {
  return !o.config && o.exit_code == 2 && o.message.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("nnodes accepts N and MIN:MAX and rejects everything else naming the flag") {
  CHECK(parse_nnodes("3")->min == 3);
  CHECK(parse_nnodes("3")->max == 3);
  CHECK(parse_nnodes("1:4")->max == 4);
  CHECK(parse_nnodes("1:4")->elastic());
  for (const char* bad : {"0", "", "x", "4:2", "1:", ":3", "-1", "1:2:3"}) {
    auto r = parse_nnodes(bad);
    REQUIRE(!r);
    CHECK(r.error().message().find("--nnodes") != std::string::npos);
    CHECK(r.error().message().find("MIN:MAX") != std::string::npos);
  }
}

TEST_CASE("nproc-per-node takes a count, cpu, or auto, and gpu fails clearly without a GPU") {
  CHECK(*parse_nproc_per_node("4") == 4);
  CHECK(*parse_nproc_per_node("cpu") >= 1);
  CHECK(*parse_nproc_per_node("auto") >= 1);
  auto zero = parse_nproc_per_node("0");
  REQUIRE(!zero);
  CHECK(zero.error().message().find("--nproc-per-node: '0'") != std::string::npos);
  auto gpu = parse_nproc_per_node("gpu");
  if (!gpu) CHECK(gpu.error().message().find("--nproc-per-node") != std::string::npos);
}

TEST_CASE("rdzv-conf, redirects and tee are parsed and validated") {
  auto conf = parse_rdzv_conf("timeout=30s, last_call_timeout=200ms,is_host=false");
  REQUIRE(conf);
  CHECK(conf->at("timeout") == "30s");
  CHECK(conf->at("is_host") == "false");
  CHECK(!parse_rdzv_conf("novalue"));
  CHECK(parse_rdzv_conf("")->empty());
  auto all = parse_stream_selection("--tee", "3");
  REQUIRE(all);
  CHECK(all->for_local_rank(5) == 3);
  auto per = parse_stream_selection("--redirects", "0:1,2:3");
  REQUIRE(per);
  CHECK(per->for_local_rank(0) == 1);
  CHECK(per->for_local_rank(1) == 0);
  CHECK(per->for_local_rank(2) == 3);
  auto bad = parse_stream_selection("--redirects", "0:4");
  REQUIRE(!bad);
  CHECK(bad.error().message().find("--redirects: '0:4'") != std::string::npos);
}

TEST_CASE("the command line fills a config and leaves the worker's arguments alone") {
  auto o = parse({"--nnodes",
                  "2:3",
                  "--nproc_per_node",
                  "2",
                  "--rdzv-backend",
                  "etcd",
                  "--rdzv-endpoint",
                  "127.0.0.1:2379",
                  "--rdzv-id",
                  "job7",
                  "--rdzv-conf",
                  "timeout=5s,last_call_timeout=300ms",
                  "--max-restarts",
                  "3",
                  "--role",
                  "trainer",
                  "--tee",
                  "2",
                  "/bin/prog",
                  "--nnodes",
                  "x",
                  "-v"});
  REQUIRE_MESSAGE(o.config, o.message);
  const auto& c = *o.config;
  CHECK(c.nnodes.min == 2);
  CHECK(c.nnodes.max == 3);
  CHECK(c.nproc_per_node == 2);
  CHECK(c.backend == rdzv_backend::etcd);
  CHECK(c.rdzv_id == "job7");
  CHECK(c.join_timeout == std::chrono::seconds(5));
  CHECK(c.last_call == std::chrono::milliseconds(300));
  CHECK(c.max_restarts == 3);
  CHECK(c.role == "trainer");
  CHECK(c.tee.all == 2);
  CHECK(c.program == "/bin/prog");
  CHECK(c.args == std::vector<std::string>{"--nnodes", "x", "-v"});
}

TEST_CASE("every bad flag value is an error that names the flag and the value") {
  CHECK(error_mentions(parse({"--max-restarts", "-1", "p"}), "--max-restarts: '-1'"));
  CHECK(error_mentions(parse({"--monitor-interval", "soon", "p"}), "--monitor-interval: 'soon'"));
  CHECK(error_mentions(parse({"--rdzv-backend", "zk", "p"}), "--rdzv-backend: 'zk'"));
  CHECK(error_mentions(parse({"--master-port", "70000", "p"}), "--master-port: '70000'"));
  CHECK(error_mentions(parse({"--node-rank", "x", "p"}), "--node-rank: 'x'"));
  CHECK(error_mentions(parse({"--nnodes", "2", "--node-rank", "2", "p"}), "--node-rank"));
  CHECK(error_mentions(parse({"--rdzv-conf", "color=red", "p"}), "unknown key 'color'"));
  CHECK(error_mentions(parse({"--rdzv-conf", "timeout=x", "p"}), "--rdzv-conf timeout: 'x'"));
  CHECK(error_mentions(parse({"--rdzv-backend", "etcd", "p"}), "--rdzv-endpoint"));
  CHECK(error_mentions(parse({"--rdzv-backend", "store", "--rdzv-endpoint", "nohost", "p"}),
                       "--rdzv-endpoint: 'nohost'"));
  CHECK(error_mentions(parse({"--nnodes", "1:2", "p"}), "static"));
  CHECK(error_mentions(parse({"--standalone", "--nnodes", "2", "p"}), "--standalone"));
  CHECK(error_mentions(parse({"--nproc-per-node", "2"}), "no worker executable"));
  CHECK(error_mentions(parse({"--bogus", "p"}), "--bogus"));
}

TEST_CASE("help documents every flag of the launcher") {
  auto o = parse({"--help"});
  CHECK(!o.config);
  CHECK(o.exit_code == 0);
  for (const char* flag : {"--nnodes",
                           "--nproc-per-node",
                           "--node-rank",
                           "--rdzv-backend",
                           "--rdzv-endpoint",
                           "--rdzv-id",
                           "--rdzv-conf",
                           "--standalone",
                           "--max-restarts",
                           "--monitor-interval",
                           "--role",
                           "--log-dir",
                           "--redirects",
                           "--tee",
                           "--master-addr",
                           "--master-port",
                           "--local-ranks-filter",
                           "--metrics-port",
                           "--start-method",
                           "--no-python",
                           "--version",
                           "PET_",
                           "TROUPE_ERROR_FILE",
                           "TORCHELASTIC_ERROR_FILE"})
    CHECK_MESSAGE(o.message.find(flag) != std::string::npos, flag);
}

TEST_CASE("--metrics-port is off by default, takes 0 to 65535 and refuses anything else") {
  auto off = parse({"--standalone", "p"});
  REQUIRE(off.config);
  CHECK(off.config->metrics_port == -1);
  auto any = parse({"--standalone", "--metrics-port", "0", "p"});
  REQUIRE(any.config);
  CHECK(any.config->metrics_port == 0);
  auto fixed = parse({"--standalone", "--metrics_port", "9400", "p"});
  REQUIRE(fixed.config);
  CHECK(fixed.config->metrics_port == 9400);
  CHECK(error_mentions(parse({"--standalone", "--metrics-port", "70000", "p"}),
                       "--metrics-port: '70000'"));
  CHECK(error_mentions(parse({"--standalone", "--metrics-port", "-1", "p"}), "--metrics-port"));
}

TEST_CASE("standalone uses the store backend on one node") {
  auto o = parse({"--standalone", "--nproc-per-node", "3", "p"});
  REQUIRE(o.config);
  CHECK(o.config->backend == rdzv_backend::store);
  CHECK(o.config->nproc_per_node == 3);
}

TEST_CASE("a worker's environment carries troupe's and torchrun's names") {
  worker_assignment a;
  a.local_rank = 1;
  a.rank = 5;
  a.group_rank = 2;
  a.world_size = 8;
  a.local_world_size = 2;
  a.restart_count = 3;
  a.max_restarts = 4;
  a.run_id = "job";
  a.store_url = "tcp://127.0.0.1:1";
  auto e = worker_environment(a, true);
  auto get = [&](const std::string& k) {
    auto it = std::find_if(e.begin(), e.end(), [&](const auto& kv) { return kv.first == k; });
    return it == e.end() ? std::string("<unset>") : it->second;
  };
  CHECK(get("RANK") == "5");
  CHECK(get("LOCAL_RANK") == "1");
  CHECK(get("GROUP_RANK") == "2");
  CHECK(get("WORLD_SIZE") == "8");
  CHECK(get("LOCAL_WORLD_SIZE") == "2");
  CHECK(get("TROUPE_RESTART_COUNT") == "3");
  CHECK(get("TORCHELASTIC_RESTART_COUNT") == "3");
  CHECK(get("TORCHELASTIC_MAX_RESTARTS") == "4");
  CHECK(get("TORCHELASTIC_RUN_ID") == "job");
  CHECK(get("TROUPE_STORE_URL") == "tcp://127.0.0.1:1");
  CHECK(get("OMP_NUM_THREADS") == "1");
  CHECK(worker_environment(a, false).size() == e.size() - 1);

  const char* base[] = {"PATH=/bin", "RANK=99", "TROUPE_STORE_URL=tcp://elsewhere:1", nullptr};
  auto merged = merged_environment(base, {{"RANK", "5"}});
  CHECK(merged == std::vector<std::string>{"PATH=/bin", "RANK=5"});
}
