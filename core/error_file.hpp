// Root-cause error files, as torchrun's workers write them: a failing worker records what
// went wrong in a JSON file that its launcher reads and quotes in its failure report.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <troupe/core/error.hpp>

namespace troupe {

/// Where this process records its error: $TROUPE_ERROR_FILE, else $TORCHELASTIC_ERROR_FILE
/// (torchrun's variable, so tools written for torchrun find it), else "" (nothing recorded).
/// troupe-run sets both per worker to error.json in the worker's log folder.
std::string error_file_path();

/// Writes `message` with the current time (seconds since the epoch) and the calling thread's
/// stack trace (where the platform gives one) to error_file_path(), in torchrun's layout:
///   {"message": {"message": M, "extraInfo": {"py_callstack": S, "timestamp": "T"}}}
/// A file already there is kept (the first failure is the root cause). Returns false when
/// there is no path or the file cannot be written; never throws.
bool record_error(std::string_view message) noexcept;
bool record_error(const error& e) noexcept;

/// Runs `fn` as a worker's main: returns what it returns; an exception escaping it is
/// recorded (record_error) and reported on stderr, and 1 returned. Also installs
/// install_terminate_handler().
int run_main(const std::function<int()>& fn);

/// Makes std::terminate (an exception escaping a thread, a noexcept violation) record the
/// error file before aborting.
void install_terminate_handler();

/// Reads an error file written by record_error or by torchrun's `@record`: the message and,
/// when present, the timestamp and the stack. Empty message: not readable as one.
struct error_file_content {
  /// The root cause's text.
  std::string message;
  /// When it was written, in seconds since the epoch as text; may be empty.
  std::string timestamp;
  /// A stack trace, one frame a line; may be empty.
  std::string stack;
};
error_file_content read_error_file(const std::string& path);

}  // namespace troupe
