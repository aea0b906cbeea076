// troupe-run: the elastic, fault-tolerant launcher (see docs/launcher.md).
//   troupe-run [flags] PROGRAM [ARGS...]
//   troupe-run status HOST:PORT        (the status of a job run with --metrics-port)
#include <cstdio>
#include <cstring>
#include <iostream>

#include <troupe/launcher/agent.hpp>
#include <troupe/launcher/cli.hpp>
#include <troupe/launcher/metrics_server.hpp>

namespace {

// `troupe-run status ENDPOINT [--timeout 5s]`: 0 printed, 1 nothing answered, 2 bad usage.
int status_command(int argc, char** argv) {
  std::string endpoint;
  troupe::duration timeout = std::chrono::seconds(5);
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--timeout") && i + 1 < argc) {
      auto t = troupe::parse_duration(argv[++i]);
      if (!t || t->count() <= 0) {
        std::cerr << "troupe-run status: --timeout: '" << argv[i]
                  << "' is not a positive duration (e.g. 5s or 500ms)\n";
        return 2;
      }
      timeout = *t;
    } else if (a == "-h" || a == "--help") {
      std::cout << "troupe-run status HOST:PORT [--timeout 5s]: prints the status of the "
                   "troupe-run started with --metrics-port PORT on HOST (GET /status) as a "
                   "table\n";
      return 0;
    } else if (endpoint.empty() && !a.starts_with("-")) {
      endpoint = a;
    } else {
      std::cerr << "troupe-run status: unexpected argument '" << a
                << "'; usage: troupe-run status HOST:PORT [--timeout 5s]\n";
      return 2;
    }
  }
  if (endpoint.empty()) {
    std::cerr << "troupe-run status: which job? usage: troupe-run status HOST:PORT [--timeout "
                 "5s] (the address and --metrics-port of its troupe-run)\n";
    return 2;
  }
  auto table = troupe::launcher::fetch_status_table(endpoint, timeout);
  if (!table) {
    std::cerr << "troupe-run status: " << table.error().message() << "\n";
    return table.error().code() == troupe::errc::invalid_argument ? 2 : 1;
  }
  std::cout << *table;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "status") == 0) return status_command(argc, argv);
  auto outcome = troupe::launcher::parse_command_line(argc, argv);
  if (!outcome.config) {
    auto& os = outcome.exit_code == 0 ? std::cout : std::cerr;
    os << (outcome.exit_code == 0 ? "" : "troupe-run: ") << outcome.message << "\n";
    return outcome.exit_code;
  }
  return troupe::launcher::run_agent(*outcome.config);
}
