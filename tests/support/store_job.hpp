// store_job: the shared set-up of multi-process tests whose workers meet through a job's
// store: a real TCP store server on 127.0.0.1, a client of it, the test's records under
// `scope`, a scratch folder for the workers' logs, and the workers, which are killed (and
// reaped) before the store goes, on every exit path.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

namespace troupe::test {

struct store_job {
  std::unique_ptr<tcp_store_server> server;
  std::shared_ptr<store> client;
  std::unique_ptr<prefix_store> records;
  std::string scope;
  std::filesystem::path dir;
  std::map<std::string, child_process> workers;

  /// Starts the server and connects; the scratch folder is <temp>/<dir_name>-<pid>.
  store_job(std::string scope_name, const std::string& dir_name) : scope(std::move(scope_name)) {
    using namespace std::chrono_literals;
    auto started = tcp_store_server::start({});
    REQUIRE(started.has_value());
    server = std::move(*started);
    store_options o;
    o.connect_timeout = 5s;
    o.timeout = 10s;
    auto c = connect_store(server->url(), o);
    REQUIRE(c.has_value());
    client = std::move(*c);
    records = std::make_unique<prefix_store>(client, scope);
    dir = std::filesystem::temp_directory_path() / (dir_name + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~store_job() {
    workers.clear();  // kills what is left before the store goes
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  store_job(const store_job&) = delete;
  store_job& operator=(const store_job&) = delete;
};

}  // namespace troupe::test
