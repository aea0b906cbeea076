#include <doctest/doctest.h>

#include <troupe/core/cluster_env.hpp>

using namespace troupe;
using vars = std::map<std::string, std::string>;

TEST_CASE("a troupe-run worker finds its rank, its world and the job's store") {
  auto e = detect_cluster_env(vars{{"TROUPE_RUN_ID", "r1"},
                                   {"RANK", "3"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"},
                                   {"GROUP_RANK", "1"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "29400"},
                                   {"TROUPE_RESTART_COUNT", "2"},
                                   {"TROUPE_STORE_URL", "tcp://127.0.0.1:4000"}});
  REQUIRE_MESSAGE(e, e.error().to_string());
  CHECK(e->kind == cluster_kind::troupe_run);
  CHECK(e->rank == 3);
  CHECK(e->world_size == 8);
  CHECK(e->local_rank == 1);
  CHECK(e->node_rank == 1);
  CHECK(e->restart_count == 2);
  CHECK(e->store_url == "tcp://127.0.0.1:4000");
  CHECK_FALSE(e->host_store);
}

TEST_CASE("a torchrun worker uses MASTER_ADDR:MASTER_PORT as the store, hosted by rank 0") {
  vars v{{"TORCHELASTIC_RUN_ID", "job"},
         {"RANK", "0"},
         {"WORLD_SIZE", "4"},
         {"LOCAL_RANK", "0"},
         {"LOCAL_WORLD_SIZE", "4"},
         {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", "29500"}};
  auto e = detect_cluster_env(v);
  REQUIRE_MESSAGE(e, e.error().to_string());
  CHECK(e->kind == cluster_kind::torchrun);
  CHECK(e->store_url == "tcp://127.0.0.1:29500");
  CHECK(e->host_store);
  v["RANK"] = "2";
  v["LOCAL_RANK"] = "2";
  CHECK_FALSE(detect_cluster_env(v)->host_store);
}

TEST_CASE("a Slurm task derives its master from the node list and a port from the job id") {
  auto e = detect_cluster_env(vars{{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "8"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_NNODES", "2"},
                                   {"SLURM_JOB_ID", "123456"},
                                   {"SLURM_STEP_NODELIST", "gpu[07-08]"}});
  REQUIRE_MESSAGE(e, e.error().to_string());
  CHECK(e->kind == cluster_kind::slurm);
  CHECK(e->rank == 5);
  CHECK(e->local_world_size == 4);
  CHECK(e->master_addr == "gpu07");
  CHECK(e->master_port == 20000 + 123456 % 20000);
  CHECK(e->store_url == "tcp://gpu07:" + std::to_string(e->master_port));
  CHECK(e->run_id == "123456");
}

TEST_CASE("Slurm host lists yield their first host") {
  CHECK(*first_slurm_host("node[01-04,07],gpu7") == "node01");
  CHECK(*first_slurm_host("a,b") == "a");
  CHECK(*first_slurm_host("n[3]-ib") == "n3-ib");
  CHECK_FALSE(first_slurm_host(""));
  CHECK_FALSE(first_slurm_host("n[01-02"));
}

TEST_CASE("no launcher environment is not_found and says what to set") {
  auto e = detect_cluster_env(vars{{"HOME", "/root"}});
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::not_found);
  CHECK(e.error().message().find("troupe-run, torchrun or srun") != std::string::npos);
}

TEST_CASE("malformed and inconsistent variables are refused by name") {
  auto bad = detect_cluster_env(vars{{"RANK", "x"}, {"WORLD_SIZE", "2"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("RANK='x'") != std::string::npos);
  auto outside = detect_cluster_env(
      vars{{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  REQUIRE_FALSE(outside);
  CHECK(outside.error().message().find("rank 4 is outside a world of 4") != std::string::npos);
  auto no_store = detect_cluster_env(vars{{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  REQUIRE_FALSE(no_store);
  CHECK(no_store.error().message().find("MASTER_ADDR and MASTER_PORT") != std::string::npos);
}

TEST_CASE("a single process with RANK and WORLD_SIZE alone needs no store") {
  auto e = detect_cluster_env(vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  REQUIRE_MESSAGE(e, e.error().to_string());
  CHECK(e->store_url.empty());
}

TEST_CASE("every launcher's attempt gets its own store scope, so restarts never meet old records") {
  vars troupe_run{{"TROUPE_RUN_ID", "r1"},
                  {"RANK", "0"},
                  {"WORLD_SIZE", "2"},
                  {"TROUPE_STORE_URL", "tcp://127.0.0.1:4000"},
                  {"TROUPE_RESTART_COUNT", "1"},
                  {"TROUPE_ROUND", "3"},
                  {"TROUPE_STORE_PREFIX", "troupe-run/r1/workers/3"}};
  CHECK(detect_cluster_env(troupe_run).value().store_scope == "troupe-run/r1/workers/3");
  troupe_run.erase("TROUPE_STORE_PREFIX");  // a multi-node static job: no store offered
  CHECK(detect_cluster_env(troupe_run).value().store_scope == "troupe-run/r1/round-3");

  vars torchrun{{"TORCHELASTIC_RUN_ID", "job"},
                {"RANK", "1"},
                {"WORLD_SIZE", "2"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "29500"},
                {"TORCHELASTIC_RESTART_COUNT", "2"}};
  CHECK(detect_cluster_env(torchrun).value().store_scope == "torchrun/job/attempt-2");

  vars slurm{{"SLURM_PROCID", "0"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_JOB_ID", "77"},
             {"SLURM_RESTART_COUNT", "1"},
             {"SLURM_STEP_NODELIST", "localhost"}};
  auto s = detect_cluster_env(slurm).value();
  CHECK(s.store_scope == "slurm/77/attempt-1");
  CHECK(s.restart_count == 1);

  vars bare{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}};
  CHECK(detect_cluster_env(bare).value().store_scope.empty());  // rank 0 hosts a fresh store
}

TEST_CASE("TROUPE_STORE_URL names the store under any launcher; else rank 0 hosts one") {
  vars v{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}};
  auto e = detect_cluster_env(v).value();
  CHECK(e.store_url == "tcp://h:1234");
  CHECK(e.store_at_master);
  CHECK(e.host_store);
  v["TROUPE_STORE_URL"] = "tcp://store-host:29400";
  e = detect_cluster_env(v).value();
  CHECK(e.store_url == "tcp://store-host:29400");
  CHECK_FALSE(e.store_at_master);
  CHECK_FALSE(e.host_store);
}

TEST_CASE("under torchrun's agent store, troupe's store takes the port after MASTER_PORT") {
  vars v{{"TORCHELASTIC_RUN_ID", "job"},
         {"RANK", "0"},
         {"WORLD_SIZE", "2"},
         {"MASTER_ADDR", "h"},
         {"MASTER_PORT", "29500"},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  CHECK(detect_cluster_env(v).value().store_url == "tcp://h:29501");
  v["MASTER_PORT"] = "65535";
  auto e = detect_cluster_env(v);
  REQUIRE_FALSE(e);
  CHECK(e.error().message().find("MASTER_PORT=65535") != std::string::npos);
}
