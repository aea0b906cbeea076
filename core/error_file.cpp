#include <troupe/core/error_file.hpp>

#include <execinfo.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>

#include <troupe/core/json.hpp>
#include <troupe/core/settings.hpp>

namespace troupe {

namespace {

std::string stack_trace() {
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  std::string out;
  char** names = ::backtrace_symbols(frames, n);
  if (names == nullptr) return out;
  for (int i = 0; i < n; ++i) {
    out += names[i];
    out += '\n';
  }
  std::free(names);
  return out;
}

// The JSON string value that starts at text[pos] (a '"'), unescaped; pos moves past it.
std::string read_json_string(const std::string& text, std::size_t& pos) {
  std::string out;
  if (pos >= text.size() || text[pos] != '"') return out;
  for (++pos; pos < text.size() && text[pos] != '"'; ++pos) {
    char ch = text[pos];
    if (ch == '\\' && pos + 1 < text.size()) {
      char e = text[++pos];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'u':
          if (pos + 4 < text.size()) {
            out += static_cast<char>(std::strtol(text.substr(pos + 1, 4).c_str(), nullptr, 16));
            pos += 4;
          }
          break;
        default:
          out += e;
      }
    } else {
      out += ch;
    }
  }
  ++pos;
  return out;
}

// The string value of the first "key": "..." at or after `from` (a flat search: enough for
// the layout record_error and torchrun write).
std::string string_field(const std::string& text, std::string_view key, std::size_t from = 0) {
  const std::string quoted = "\"" + std::string(key) + "\"";
  for (auto at = text.find(quoted, from); at != std::string::npos; at = text.find(quoted, at + 1)) {
    std::size_t pos = at + quoted.size();
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == ':' || text[pos] == '\n')) ++pos;
    if (pos < text.size() && text[pos] == '"') return read_json_string(text, pos);
  }
  return {};
}

}  // namespace

std::string error_file_path() { return settings::error_file.value().value_or(std::string()); }

bool record_error(std::string_view message) noexcept {
  try {
    const std::string path = error_file_path();
    if (path.empty()) return false;
    std::string json = "{\"message\": {\"message\": ";
    append_json_string(json, message);
    json += ", \"extraInfo\": {\"py_callstack\": ";
    append_json_string(json, stack_trace());
    json += ", \"timestamp\": \"";
    json += std::to_string(static_cast<long long>(std::time(nullptr)));
    json += "\"}}}\n";
    // O_EXCL: the first failure recorded is the root cause; later ones do not overwrite it.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    std::size_t done = 0;
    while (done < json.size()) {
      const ssize_t n = ::write(fd, json.data() + done, json.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return done == json.size();
  } catch (...) {
    return false;
  }
}

bool record_error(const error& e) noexcept {
  try {
    return record_error(std::string_view(e.message()));
  } catch (...) {
    return false;
  }
}

void install_terminate_handler() {
  static const std::terminate_handler previous = std::get_terminate();
  std::set_terminate([] {
    std::string message = "std::terminate called";
    if (auto ex = std::current_exception()) {
      try {
        std::rethrow_exception(ex);
      } catch (const std::exception& e) {
        message = std::string("uncaught exception: ") + e.what();
      } catch (...) {
        message = "uncaught exception of unknown type";
      }
    }
    record_error(message);
    if (previous != nullptr) previous();
    std::abort();
  });
}

int run_main(const std::function<int()>& fn) {
  install_terminate_handler();
  try {
    return fn();
  } catch (const std::exception& e) {
    const std::string message = std::string("uncaught exception: ") + e.what();
    record_error(message);
    std::cerr << message << std::endl;
  } catch (...) {
    record_error("uncaught exception of unknown type");
    std::cerr << "uncaught exception of unknown type" << std::endl;
  }
  return 1;
}

error_file_content read_error_file(const std::string& path) {
  error_file_content c;
  std::ifstream in(path);
  if (!in) return c;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // torchrun's layout nests the message: {"message": {"message": M, "extraInfo": {...}}}.
  auto outer = text.find("\"message\"");
  if (outer == std::string::npos) return c;
  c.message = string_field(text, "message", outer + 1);
  if (c.message.empty()) c.message = string_field(text, "message");
  c.timestamp = string_field(text, "timestamp");
  c.stack = string_field(text, "py_callstack");
  return c;
}

}  // namespace troupe
