// A worker process for the multi-process RPC tests.
//   rpc_test_worker <mode> <store_url> <name> <rank> <world_size or ->
// Modes:
//   static_all   join a static group, call every worker (itself included) in every way,
//                then shut down. Exit 0 when every check passed.
//   serve_static join a static group and serve until the store key "<group>/stop" exists.
//   serve_dynamic join a dynamic group and serve until asked to leave ("leave_soon").
//   bad_map      join a static group whose rank 1 has a device map to an invalid device;
//                writes the init error's text to "errors/<rank>" in the store.
// Exit codes: 0 ok, 2 init failed, 3 a check failed.
// With RPC_TEST_TCP_ONLY=1 in the environment it uses no local socket (TCP to peers on this
// host too); TLS comes from TROUPE_TLS_* as for any worker.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>

using namespace troupe;
using namespace troupe::rpc;

namespace {

std::atomic<agent*> the_agent{nullptr};
// References this worker was given and keeps until it exits (or is killed).
std::mutex kept_mu;
std::vector<remote_ref<int>>* kept = new std::vector<remote_ref<int>>();
std::atomic<bool> leave_requested{false};
std::atomic<long> told{0};  // the sum of one-way "tell" calls received

// Calls can arrive while init is still finishing (the group knows a joiner before its
// init returns): wait for the agent, bounded.
agent& wait_agent() {
  auto d = deadline::after(std::chrono::seconds(10));
  while (!the_agent.load() && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!the_agent.load()) std::abort();
  return *the_agent.load();
}

std::shared_ptr<function_table> make_functions() {
  auto t = std::make_shared<function_table>();
  (void)t->add("add", [](int a, int b) { return a + b; });
  (void)t->add("whoami", [](const call_info& c) { return c.caller.name; });
  (void)t->add("echo", [](tensor x) { return x; });
  (void)t->add("sleep_ms", [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  });
  (void)t->add("fail", [](std::string why) -> int { throw std::runtime_error(why); });
  (void)t->add("call_other", [](std::string target, int a, int b) -> expected<int> {
    return wait_agent().rpc_sync<int>(target, "add", a, b);
  });
  (void)t->add("workers", [] {
    std::vector<std::string> names;
    for (auto& w : wait_agent().workers()) names.push_back(w.name);
    return names;
  });
  (void)t->add("keep_ref", [](remote_ref<int> r) -> expected<int> {
    {
      std::lock_guard<std::mutex> lk(kept_mu);
      kept->push_back(r);
    }
    return r.to_here(std::chrono::seconds(10));
  });
  (void)t->add("tell", [](int v) { told += v; });
  (void)t->add("told", [] { return told.load(); });
  (void)t->add("leave_soon", [] {
    leave_requested = true;
    return true;
  });
  return t;
}

int fail(const std::string& what) {
  std::cerr << "rpc_test_worker check failed: " << what << std::endl;
  return 3;
}

int static_all(agent& a) {
  auto me = a.self();
  auto all = a.workers();
  for (auto& w : all) {
    auto sum = a.rpc_sync<int>(w.name, "add", me.id, 100 * w.id);
    if (!sum || *sum != me.id + 100 * w.id) return fail("add on " + w.name);
    auto by_id = a.rpc_sync<int>(worker_ref::by_id(w.id), "add", 1, 2);
    if (!by_id || *by_id != 3) return fail("add by id on " + w.name);
    auto who = a.rpc_sync<std::string>(w.name, "whoami");
    if (!who || *who != me.name) return fail("whoami on " + w.name);
    std::vector<float> v(1000 + 10 * static_cast<std::size_t>(me.id));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i * (me.id + 1));
    auto t = tensor::from<float>(v, dtype::float32);
    auto back = a.rpc_sync<tensor>(w.name, "echo", t);
    if (!back || !same_values(*back, t)) return fail("echo on " + w.name);
    auto next = all[static_cast<std::size_t>((w.id + 1) % static_cast<int>(all.size()))].name;
    auto nested = a.rpc_sync<int>(w.name, "call_other", next, 5, me.id);
    if (!nested || *nested != 5 + me.id) return fail("nested call through " + w.name);
    auto err = a.rpc_sync<int>(w.name, "fail", std::string("on purpose"));
    if (err || err.error().worker() != w.name ||
        err.error().message().find("on purpose") == std::string::npos)
      return fail("callee error from " + w.name);
  }
  // Pipelined async calls to everyone.
  std::vector<future<int>> fs;
  for (int i = 0; i < 64; ++i)
    fs.push_back(a.rpc_async<int>(all[static_cast<std::size_t>(i) % all.size()].name, "add", i, 1));
  auto got = when_all(std::move(fs)).get(std::chrono::seconds(20));
  if (!got) return fail("async: " + got.error().to_string());
  for (int i = 0; i < 64; ++i)
    if ((*got)[static_cast<std::size_t>(i)] != i + 1) return fail("async result");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: rpc_test_worker <mode> <store_url> <name> <rank> <world|->\n";
    return 64;
  }
  std::string mode = argv[1], url = argv[2], name = argv[3];
  int rank = std::atoi(argv[4]);
  std::optional<int> world;
  if (std::string(argv[5]) != "-") world = std::atoi(argv[5]);
  rpc_backend_options o;
  o.init_method = url;
  o.rpc_timeout = std::chrono::seconds(20);
  o.init_timeout = std::chrono::seconds(20);
  o.shutdown_timeout = std::chrono::seconds(20);
  o.functions = make_functions();
  o.device_count = 0;
  if (const char* tcp = std::getenv("RPC_TEST_TCP_ONLY"); tcp && std::string(tcp) == "1")
    o.local_socket = false;
  if (mode == "bad_map" && rank == 1) {
    device_map m;
    (void)m.set(*device::cuda(0), *device::cuda(3));
    o.device_maps["w0"] = m;
  }
  auto s = connect_store(url);
  if (!s) return 2;
  auto a = init_rpc(name, rank, world, o);
  if (!a) {
    std::cerr << name << ": init failed: " << a.error().to_string() << std::endl;
    if (mode == "bad_map") {
      auto msg = a.error().message() + " | worker=" + a.error().worker();
      (void)(*s)->set(strcat("errors/", rank), msg);
    }
    return 2;
  }
  the_agent = a->get();
  int rc = 0;
  if (mode == "static_all") {
    rc = static_all(**a);
  } else if (mode == "serve_static") {
    std::array<std::string, 1> keys{"stop"};
    (void)(*s)->wait(keys, std::chrono::seconds(60));
  } else if (mode == "serve_dynamic") {
    auto until = deadline::after(std::chrono::seconds(60));
    while (!leave_requested && !until.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (auto l = (*a)->leave(); !l) {
      std::cerr << name << ": leave failed: " << l.error().to_string() << std::endl;
      rc = 3;
    }
  }
  if (auto r = (*a)->shutdown(); !r) {
    std::cerr << name << ": shutdown failed: " << r.error().to_string() << std::endl;
    if (rc == 0) rc = 3;
  }
  the_agent = nullptr;
  a->reset();
  return rc;
}
