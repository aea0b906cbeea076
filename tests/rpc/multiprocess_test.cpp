// Groups of real worker processes on 127.0.0.1, meeting through a TCP store on a port
// the OS picked.
#include <doctest/doctest.h>

#include <signal.h>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "collectives/spawn.hpp"
#include "support/skip.hpp"

using namespace troupe;
using namespace troupe::rpc;
using troupe::collectives::testing::exited_zero;
using troupe::collectives::testing::start_process;
using troupe::collectives::testing::wait_children;

namespace {

const std::string worker_bin = TROUPE_RPC_TEST_WORKER;

std::unique_ptr<tcp_store_server> start_store() {
  auto s = tcp_store_server::start({});
  REQUIRE(s);
  return std::move(*s);
}

pid_t spawn(const std::string& mode, const std::string& url, const std::string& name, int rank,
            std::string world) {
  pid_t p = start_process({worker_bin, mode, url, name, std::to_string(rank), world});
  REQUIRE(p > 0);
  return p;
}

std::shared_ptr<function_table> driver_functions() {
  auto t = std::make_shared<function_table>();
  (void)t->add("add", [](int a, int b) { return a + b; });
  return t;
}

rpc_backend_options driver_options(const std::string& url) {
  rpc_backend_options o;
  o.init_method = url;
  o.rpc_timeout = std::chrono::seconds(20);
  o.init_timeout = std::chrono::seconds(20);
  o.shutdown_timeout = std::chrono::seconds(5);
  o.device_count = 0;
  o.functions = driver_functions();
  return o;
}

template <class Pred>
bool eventually(Pred p, duration limit = std::chrono::seconds(10)) {
  auto d = deadline::after(limit);
  while (!d.expired()) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return p();
}

}  // namespace

TEST_CASE("a static group of four calls every worker in every direction") {
  auto store = start_store();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r)
    pids.push_back(spawn("static_all", store->url(), "w" + std::to_string(r), r, "4"));
  auto st = wait_children(pids, std::chrono::seconds(40));
  for (auto p : pids) CHECK(exited_zero(st[p]));
}

TEST_CASE(
    "a device-map error fails init on every worker with the same message naming the culprit") {
  auto store = start_store();
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r)
    pids.push_back(spawn("bad_map", store->url(), "w" + std::to_string(r), r, "3"));
  auto st = wait_children(pids, std::chrono::seconds(30));
  for (auto p : pids) {
    REQUIRE(st[p] != -1);
    CHECK(WIFEXITED(st[p]));
    CHECK(WEXITSTATUS(st[p]) == 2);
  }
  auto s = connect_store(store->url());
  REQUIRE(s);
  std::vector<std::string> msgs;
  for (int r = 0; r < 3; ++r) {
    auto m = (*s)->get_string(strcat("errors/", r), std::chrono::seconds(2));
    REQUIRE(m);
    msgs.push_back(*m);
  }
  CHECK(msgs[0] == msgs[1]);
  CHECK(msgs[1] == msgs[2]);
  INFO(msgs[0]);
  CHECK(msgs[0].find("w1") != std::string::npos);
  CHECK(msgs[0].find("cuda:3") != std::string::npos);
  CHECK(msgs[0].find("worker=w1") != std::string::npos);
}

TEST_CASE("a dynamic group takes a fifth worker, calls it, lets it leave, and reuses its name") {
  auto store = start_store();
  auto url = store->url();
  auto driver = init_rpc("driver", 0, std::nullopt, driver_options(url));
  REQUIRE_MESSAGE(driver, (driver ? "" : driver.error().to_string()));
  auto& d = **driver;
  std::vector<pid_t> pids;
  for (int i = 1; i <= 3; ++i)
    pids.push_back(spawn("serve_dynamic", url, "w" + std::to_string(i), 0, "-"));
  REQUIRE(eventually([&] { return d.workers().size() == 4; }, std::chrono::seconds(20)));
  // The fifth worker joins; everyone learns about it.
  pid_t fifth = spawn("serve_dynamic", url, "w5", 0, "-");
  REQUIRE(eventually([&] { return d.workers().size() == 5; }, std::chrono::seconds(20)));
  auto first_id = d.worker("w5");
  REQUIRE(first_id);
  CHECK(*d.rpc_sync<int>("w5", "add", 2, 3) == 5);
  auto seen = d.rpc_sync<std::vector<std::string>>("w1", "workers");
  REQUIRE(seen);
  CHECK(seen->size() == 5);
  CHECK(*d.rpc_sync<int>("w1", "call_other", std::string("w5"), 1, 1) == 2);
  CHECK(*d.rpc_sync<int>("w5", "call_other", std::string("w2"), 3, 4) == 7);
  // It leaves: removed everywhere.
  CHECK(*d.rpc_sync<bool>("w5", "leave_soon"));
  auto st = wait_children({fifth}, std::chrono::seconds(20));
  CHECK(exited_zero(st[fifth]));
  CHECK(d.workers().size() == 4);
  CHECK(d.worker("w5").error().code() == errc::not_found);
  auto after = d.rpc_sync<std::vector<std::string>>("w2", "workers");
  REQUIRE(after);
  CHECK(std::find(after->begin(), after->end(), "w5") == after->end());
  // A new worker under the freed name.
  pid_t again = spawn("serve_dynamic", url, "w5", 0, "-");
  REQUIRE(eventually([&] { return d.workers().size() == 5; }, std::chrono::seconds(20)));
  auto second_id = d.worker("w5");
  REQUIRE(second_id);
  CHECK(second_id->id != first_id->id);
  CHECK(*d.rpc_sync<int>("w5", "add", 10, 5) == 15);
  CHECK(*d.rpc_sync<int>("w3", "call_other", std::string("w5"), 2, 2) == 4);
  // A name in use is refused.
  auto dup = init_rpc("w1", 0, std::nullopt, driver_options(url));
  REQUIRE_FALSE(dup);
  CHECK(dup.error().code() == errc::already_exists);
  // Everyone leaves.
  pids.push_back(again);
  for (int i : {1, 2, 3}) (void)d.rpc_sync<bool>("w" + std::to_string(i), "leave_soon");
  (void)d.rpc_sync<bool>("w5", "leave_soon");
  auto all = wait_children(pids, std::chrono::seconds(20));
  for (auto p : pids) CHECK(exited_zero(all[p]));
  CHECK(d.workers().size() == 1);
  CHECK(d.leave());
}

TEST_CASE("a worker killed with SIGKILL fails every pending call to it promptly, naming it") {
  auto store = start_store();
  auto url = store->url();
  pid_t child = spawn("serve_static", url, "w1", 1, "2");
  auto o = driver_options(url);
  o.shutdown_timeout = std::chrono::milliseconds(500);
  auto driver = init_rpc("w0", 0, 2, o);
  REQUIRE_MESSAGE(driver, (driver ? "" : driver.error().to_string()));
  auto& d = **driver;
  std::vector<future<int>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(d.rpc_async<int>("w1", "sleep_ms", 10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto killed_at = clock::now();
  ::kill(child, SIGKILL);
  for (auto& f : calls) {
    auto r = f.get(std::chrono::seconds(3));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::connection_lost);
    CHECK(r.error().worker() == "w1");
    CHECK(r.error().message().find("w1") != std::string::npos);
  }
  CHECK(clock::now() - killed_at < std::chrono::seconds(2));
  // Later calls fail at once with the same sticky error.
  auto later = d.rpc_sync<int>("w1", "add", 1, 2);
  REQUIRE_FALSE(later);
  CHECK(later.error().code() == errc::connection_lost);
  wait_children({child}, std::chrono::seconds(5));
  // Shutdown of the survivor is bounded even though its peer never reaches the barrier.
  auto t0 = clock::now();
  auto s = d.shutdown();
  CHECK_FALSE(s);
  CHECK(clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("the owner releases the share of a holder killed with SIGKILL") {
  auto store = start_store();
  auto url = store->url();
  pid_t child = spawn("serve_static", url, "w1", 1, "2");
  auto o = driver_options(url);
  o.shutdown_timeout = std::chrono::milliseconds(500);
  auto driver = init_rpc("w0", 0, 2, o);
  REQUIRE_MESSAGE(driver, (driver ? "" : driver.error().to_string()));
  auto& d = **driver;
  {
    // The driver owns the value and hands a share to the child, which keeps it.
    auto ref = d.remote<int>("w0", "add", 30, 12);
    auto got = d.rpc_sync<int>("w1", "keep_ref", ref);
    REQUIRE_MESSAGE(got, (got ? "" : got.error().to_string()));
    CHECK(*got == 42);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(d.owned_remote_refs() == 1);
  ::kill(child, SIGKILL);
  CHECK(eventually([&] { return d.owned_remote_refs() == 0; }, std::chrono::seconds(5)));
  wait_children({child}, std::chrono::seconds(5));
  (void)d.shutdown();
}

namespace {

// Whether this process may give a child its own host name (a UTS namespace: root, or
// CAP_SYS_ADMIN); the reason when it may not.
std::string why_no_uts_namespace() {
  pid_t p = start_process({"/usr/bin/unshare", "--uts", "/bin/true"});
  if (p <= 0) return "cannot run /usr/bin/unshare";
  auto st = wait_children({p}, std::chrono::seconds(10));
  return exited_zero(st[p]) ? "" : "unshare --uts is not permitted here (needs root)";
}

}  // namespace

TEST_CASE(
    "a worker on another host that advertises loopback fails init naming it and what to set") {
  if (auto why = why_no_uts_namespace(); !why.empty()) TROUPE_SKIP_TEST(why);
  auto store = start_store();
  // Worker 1 runs under another host name (a UTS namespace), in this network namespace so
  // that the test can still meet it: both advertise 127.0.0.1, which a real second host
  // could never reach.
  pid_t p = start_process({"/usr/bin/unshare", "--uts", "/bin/sh", "-c",
                           "hostname troupe-other-host && exec \"$0\" \"$@\"", worker_bin,
                           "serve_static", store->url(), "w1", "1", "2"});
  REQUIRE(p > 0);
  auto o = driver_options(store->url());
  o.listen_host = "127.0.0.1";
  auto a = init_rpc("w0", 0, 2, o);
  auto st = wait_children({p}, std::chrono::seconds(30));
  REQUIRE_FALSE(a);
  INFO(a.error().to_string());
  CHECK(a.error().code() == errc::invalid_argument);
  CHECK(a.error().message().find("spans 2 hosts") != std::string::npos);
  CHECK(a.error().message().find("troupe-other-host") != std::string::npos);
  CHECK(a.error().message().find("advertises 127.0.0.1") != std::string::npos);
  CHECK(a.error().message().find("TROUPE_LOCAL_ADDR") != std::string::npos);
  REQUIRE(st[p] != -1);
  CHECK(WIFEXITED(st[p]));
  CHECK(WEXITSTATUS(st[p]) == 2);  // the worker's init failed the same way
}
