// Runs the store contract against the in-process, prefix and TCP stores.
#include "store_contract.hpp"

#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace {

using namespace std::chrono_literals;

struct memory_fixture {
  troupe::memory_store base;
  std::unique_ptr<troupe::store> open() { return base.another_handle(); }
};

struct prefix_fixture {
  std::shared_ptr<troupe::memory_store> base = std::make_shared<troupe::memory_store>();
  prefix_fixture() { (void)base->set("elsewhere/noise", std::string_view("x")); }
  std::unique_ptr<troupe::store> open() {
    return std::make_unique<troupe::prefix_store>(base, "round-1");
  }
};

struct tcp_fixture {
  std::unique_ptr<troupe::tcp_store_server> server = troupe::tcp_store_server::start({}).value();
  std::unique_ptr<troupe::store> open() {
    troupe::tcp_store_options o;
    o.port = server->port();
    o.connect_timeout = 5s;
    return troupe::tcp_store::connect(o).value();
  }
};

// The same over loopback TCP: the server opens no local socket, the client asks for none.
struct tcp_only_fixture {
  std::unique_ptr<troupe::tcp_store_server> server = [] {
    troupe::tcp_store_server_options so;
    so.local_socket = false;
    return troupe::tcp_store_server::start(so).value();
  }();
  std::unique_ptr<troupe::store> open() {
    troupe::tcp_store_options o;
    o.port = server->port();
    o.connect_timeout = 5s;
    o.local_socket = false;
    return troupe::tcp_store::connect(o).value();
  }
};

struct prefix_over_tcp_fixture {
  tcp_fixture tcp;
  std::unique_ptr<troupe::store> open() {
    return std::make_unique<troupe::prefix_store>(std::shared_ptr<troupe::store>(tcp.open()),
                                                  "epoch-7");
  }
};

}  // namespace

TYPE_TO_STRING(memory_fixture);
TYPE_TO_STRING(prefix_fixture);
TYPE_TO_STRING(tcp_fixture);
TYPE_TO_STRING(tcp_only_fixture);
TYPE_TO_STRING(prefix_over_tcp_fixture);
TEST_CASE_TEMPLATE_APPLY(store_contract, std::tuple<memory_fixture, prefix_fixture, tcp_fixture,
                                                    tcp_only_fixture, prefix_over_tcp_fixture>);
