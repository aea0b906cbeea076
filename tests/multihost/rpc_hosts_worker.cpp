// A worker for the multihost RPC tests, written as a user would from the README's snippet.
//   rpc_hosts_worker static                 under troupe-run: init_rpc_from_env, then calls
//                                           every worker (itself included): add, a tensor
//                                           echo, a nested call to a third worker, and a
//                                           remote reference created here and resolved there
//   rpc_hosts_worker static_restart         the same, except that rank 1 exits with code 1
//                                           before init on attempt 0 (TROUPE_RESTART_COUNT
//                                           0), so the job completes only on a restart
//   rpc_hosts_worker dynamic <store_url> <name> <wait_for>
//                                           joins the dynamic group at <store_url> as <name>,
//                                           calls every member, prints "<name>: ready",
//                                           waits (at most 40 s) until worker <wait_for>
//                                           has called it and left the group again,
//                                           calls the members left, then leaves
//   rpc_hosts_worker joiner <store_url> <name>
//                                           joins the same dynamic group, calls every member
//                                           in every way, then leaves
// Prints "<name>: ok" and exits 0 when every check passed; 2 when init failed, 3 when a
// check failed (naming it).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <troupe/rpc/backend_registry.hpp>

using namespace troupe;
using namespace troupe::rpc;
using namespace std::chrono_literals;

namespace {

agent* the_agent = nullptr;
std::mutex greeted_mu;
std::set<std::string> greeted;   // workers that called "hello" here
std::set<std::string> finished;  // workers that called "done" here: their calls are over

std::shared_ptr<function_table> functions() {
  auto fns = std::make_shared<function_table>();
  (void)fns->add("add", [](int a, int b) { return a + b; });
  (void)fns->add("hostname", [] {
    char buf[256] = {};
    ::gethostname(buf, sizeof buf - 1);
    return std::string(buf);
  });
  (void)fns->add("echo", [](tensor x) { return x; });
  (void)fns->add("call_other", [](std::string target, int a, int b) -> expected<int> {
    return the_agent->rpc_sync<int>(target, "add", a, b);
  });
  (void)fns->add("done", [](const call_info& c) {
    std::lock_guard<std::mutex> lk(greeted_mu);
    finished.insert(c.caller.name);
    return true;
  });
  (void)fns->add("hello", [](const call_info& c) {
    std::lock_guard<std::mutex> lk(greeted_mu);
    greeted.insert(c.caller.name);
    return true;
  });
  (void)fns->add("resolve", [](remote_ref<int> r) -> expected<int> { return r.to_here(20s); });
  return fns;
}

int fail(const std::string& me, const std::string& what) {
  std::cerr << me << ": check failed: " << what << std::endl;
  return 3;
}

// Calls `to` in every way; `other` is a third worker for the nested call.
int call_everything(agent& a, const std::string& to, const std::string& other) {
  auto me = a.self();
  auto sum = a.rpc_sync<int>(to, "add", me.id, 1000);
  if (!sum || *sum != me.id + 1000)
    return fail(me.name, "add on " + to + ": " + (sum ? "" : sum.error().to_string()));
  auto host = a.rpc_sync<std::string>(to, "hostname");
  if (!host) return fail(me.name, "hostname of " + to + ": " + host.error().to_string());
  std::vector<float> v(4096);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i) * 0.5f + static_cast<float>(me.id);
  auto t = tensor::from<float>(v, dtype::float32);
  auto back = a.rpc_sync<tensor>(to, "echo", t);
  if (!back || !same_values(*back, t)) return fail(me.name, "tensor echo on " + to);
  auto nested = a.rpc_sync<int>(to, "call_other", other, 7, me.id);
  if (!nested || *nested != 7 + me.id)
    return fail(me.name, "nested call through " + to + " to " + other);
  // A remote reference owned by `to`, resolved here, and one owned here, resolved there.
  auto theirs = a.remote<int>(to, "add", 20, me.id);
  auto got = theirs.to_here(20s);
  if (!got || *got != 20 + me.id) return fail(me.name, "remote reference owned by " + to);
  auto mine = a.remote<int>(me.name, "add", 30, me.id);
  auto resolved = a.rpc_sync<int>(to, "resolve", mine);
  if (!resolved || *resolved != 30 + me.id)
    return fail(me.name, "remote reference resolved on " + to);
  auto hello = a.rpc_sync<bool>(to, "hello");
  if (!hello) return fail(me.name, "hello on " + to + ": " + hello.error().to_string());
  std::printf("%s: called %s on host %s\n", me.name.c_str(), to.c_str(), host->c_str());
  std::fflush(stdout);
  return 0;
}

int call_all(agent& a) {
  auto all = a.workers();
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto other = all[(i + 1) % all.size()].name;
    if (int rc = call_everything(a, all[i].name, other)) return rc;
  }
  return 0;
}

bool greeted_by(const std::string& name) {
  std::lock_guard<std::mutex> lk(greeted_mu);
  return greeted.count(name) > 0;
}

bool is_member(agent& a, const std::string& name) {
  for (auto& w : a.workers())
    if (w.name == name) return true;
  return false;
}

int finish(std::unique_ptr<agent> a, int rc, bool leave) {
  auto name = a->self().name;
  if (leave) {
    if (auto l = a->leave(); !l) {
      std::cerr << name << ": leave failed: " << l.error().to_string() << std::endl;
      if (rc == 0) rc = 3;
    }
  }
  if (auto s = a->shutdown(); !s) {
    std::cerr << name << ": shutdown failed: " << s.error().to_string() << std::endl;
    if (rc == 0) rc = 3;
  }
  the_agent = nullptr;
  if (rc == 0) std::printf("%s: ok\n", name.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  rpc_backend_options o;
  o.functions = functions();
  o.rpc_timeout = 20s;
  o.init_timeout = 30s;
  o.shutdown_timeout = 30s;
  if (mode == "static" || mode == "static_restart") {
    const char* attempt = std::getenv("TROUPE_RESTART_COUNT");
    const char* rank = std::getenv("RANK");
    if (mode == "static_restart" && attempt && std::string(attempt) == "0" && rank &&
        std::string(rank) == "1") {
      std::cerr << "worker1: exiting on attempt 0 on purpose" << std::endl;
      return 1;
    }
    auto a = init_rpc_from_env(o);
    if (!a) {
      std::cerr << "init failed: " << a.error().to_string() << std::endl;
      return 2;
    }
    the_agent = a->get();
    int rc = call_all(**a);
    return finish(std::move(*a), rc, false);
  }
  if ((mode == "dynamic" && argc == 5) || (mode == "joiner" && argc == 4)) {
    o.init_method = argv[2];
    std::string name = argv[3];
    auto a = init_rpc(name, -1, std::nullopt, o);
    if (!a) {
      std::cerr << name << ": init failed: " << a.error().to_string() << std::endl;
      return 2;
    }
    the_agent = a->get();
    int rc = call_all(**a);
    if (mode == "dynamic" && rc == 0) {
      std::string joiner = argv[4];
      std::printf("%s: ready\n", name.c_str());
      std::fflush(stdout);
      auto until = deadline::after(40s);
      while (!greeted_by(joiner) && !until.expired()) std::this_thread::sleep_for(20ms);
      if (!greeted_by(joiner)) rc = fail(name, joiner + " never joined and called");
      while (rc == 0 && is_member(**a, joiner) && !until.expired())
        std::this_thread::sleep_for(20ms);
      if (rc == 0 && is_member(**a, joiner)) rc = fail(name, joiner + " never left");
      if (rc == 0) rc = call_all(**a);
      // Leave only once every other member has made its last calls, some of which call
      // back here (remote references): tell each one, then wait to be told by each.
      std::vector<std::string> others;
      for (const auto& w : (*a)->workers())
        if (w.name != name) others.push_back(w.name);
      for (const auto& other : others)
        if (rc == 0 && !(*a)->rpc_sync<bool>(other, "done")) rc = fail(name, "done on " + other);
      auto all_done = [&] {
        std::lock_guard<std::mutex> lk(greeted_mu);
        for (const auto& other : others)
          if (!finished.count(other)) return false;
        return true;
      };
      while (rc == 0 && !all_done() && !until.expired()) std::this_thread::sleep_for(20ms);
      if (rc == 0 && !all_done()) rc = fail(name, "the other members never finished their calls");
    }
    return finish(std::move(*a), rc, true);
  }
  std::cerr << "usage: rpc_hosts_worker static | dynamic <store_url> <name> <wait_for> | "
               "joiner <store_url> <name>\n";
  return 64;
}
