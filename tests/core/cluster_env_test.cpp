#include <doctest/doctest.h>

#include "core/cluster_env.hpp"

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
