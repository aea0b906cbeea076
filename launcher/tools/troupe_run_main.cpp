// troupe-run: the elastic, fault-tolerant launcher (see docs/launcher.md).
#include <cstdio>
#include <iostream>

#include "launcher/agent.hpp"
#include "launcher/cli.hpp"

int main(int argc, char** argv) {
  auto outcome = troupe::launcher::parse_command_line(argc, argv);
  if (!outcome.config) {
    auto& os = outcome.exit_code == 0 ? std::cout : std::cerr;
    os << (outcome.exit_code == 0 ? "" : "troupe-run: ") << outcome.message << "\n";
    return outcome.exit_code;
  }
  return troupe::launcher::run_agent(*outcome.config);
}
