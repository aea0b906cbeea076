// The troupe-run command line: torchrun's flags (dashes or underscores), then the worker
// executable and its arguments.
#pragma once

#include <optional>
#include <string>

#include <troupe/launcher/config.hpp>

namespace troupe::launcher {

/// What parsing the command line produced: a finished config, or a message to print
/// (help text with exit code 0, or an error naming the flag with exit code 2).
struct cli_outcome {
  std::optional<run_config> config;
  int exit_code = 0;
  std::string message;
};

/// Parses argv (argv[0] is the program name). Never throws, never exits.
cli_outcome parse_command_line(int argc, const char* const* argv);

}  // namespace troupe::launcher
