// The TCP store server with several event loops: connections spread over them, writes on
// one loop waking waiters on the others, and shutdown closing every loop's connections.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tcp_store;
using troupe::tcp_store_server;

std::unique_ptr<tcp_store_server> start_with_loops(std::size_t loops) {
  troupe::tcp_store_server_options o;
  o.io_threads = loops;
  auto s = tcp_store_server::start(std::move(o));
  REQUIRE(s.has_value());
  return std::move(*s);
}

std::unique_ptr<tcp_store> connect_client(const tcp_store_server& server) {
  troupe::tcp_store_options o;
  o.port = server.port();
  o.connect_timeout = 3s;
  auto c = tcp_store::connect(std::move(o));
  REQUIRE(c.has_value());
  return std::move(*c);
}

}  // namespace

TEST_CASE("the tcp store server refuses more than 64 I/O threads, naming the option") {
  troupe::tcp_store_server_options o;
  o.io_threads = 65;
  auto s = tcp_store_server::start(o);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code() == errc::invalid_argument);
  CHECK(s.error().message().find("io_threads") != std::string::npos);
}

TEST_CASE("one set wakes waiters whose connections live on every loop") {
  auto server = start_with_loops(3);
  // Seven connections over three loops: waiters share the setter's loop and sit on others.
  std::vector<std::unique_ptr<tcp_store>> waiters;
  for (int i = 0; i < 6; ++i) waiters.push_back(connect_client(*server));
  auto setter = connect_client(*server);
  for (int round = 0; round < 20; ++round) {
    std::string key = "round-" + std::to_string(round);
    std::atomic<int> woken{0};
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < waiters.size(); ++i)
      threads.emplace_back([&, i] {
        if (i % 2 == 0) {
          auto v = waiters[i]->get(key, 10s);
          if (v && troupe::to_string(*v) == "value") woken++;
        } else {
          std::vector<std::string> keys{key};
          if (waiters[i]->wait(keys, 10s)) woken++;
        }
      });
    REQUIRE(setter->set(key, std::string_view("value")));
    for (auto& t : threads) t.join();
    CHECK(woken.load() == static_cast<int>(waiters.size()));
  }
  CHECK(server->num_connections() == waiters.size() + 1);
}

TEST_CASE("clients on different loops update shared counters without losing an add") {
  auto server = start_with_loops(4);
  constexpr int clients = 8;
  constexpr int ops = 100;
  std::vector<std::unique_ptr<tcp_store>> handles;
  for (int i = 0; i < clients; ++i) handles.push_back(connect_client(*server));
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      auto& h = *handles[static_cast<std::size_t>(c)];
      for (int i = 0; i < ops; ++i) {
        if (!h.add("total", 1)) failures++;
        std::string key = "k-" + std::to_string(c) + "-" + std::to_string(i);
        if (!h.set(key, std::string_view(key))) failures++;
        auto v = h.get(key, 5s);
        if (!v || troupe::to_string(*v) != key) failures++;
      }
    });
  for (auto& t : pool) t.join();
  CHECK(failures.load() == 0);
  CHECK(handles[0]->add("total", 0).value() == clients * ops);
  CHECK(handles[3]->num_keys(5s).value() == clients * ops + 1);
}

TEST_CASE("shutting down a server with several loops fails the blocked clients of every loop") {
  auto server = start_with_loops(4);
  std::vector<std::unique_ptr<tcp_store>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(connect_client(*server));
  std::vector<troupe::expected<troupe::bytes>> got(clients.size(),
                                                   troupe::make_error(errc::internal, "not run"));
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < clients.size(); ++i)
    threads.emplace_back([&, i] { got[i] = clients[i]->get("never-written", 30s); });
  // Whether each get is parked before the shutdown or not, every one must fail promptly.
  server->shutdown(5s);
  for (auto& t : threads) t.join();
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (const auto& g : got) {
    REQUIRE_FALSE(g.has_value());
    CHECK(g.error().code() == errc::connection_lost);
  }
}
