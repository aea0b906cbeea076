#include <troupe/core/trace.hpp>

#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include <troupe/core/json.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::trace {

namespace detail {
std::atomic<int> state{0};
}  // namespace detail

namespace {

constexpr std::size_t flush_bytes = 64 * 1024;
constexpr std::int64_t flush_interval_ns = 500'000'000;

struct recorder {
  std::mutex mu;
  std::FILE* file = nullptr;
  std::string path;
  std::int64_t pid = 0;
  std::string buffer;
  std::int64_t last_flush = 0;
  bool decided = false;

  void write_locked() {
    if (file == nullptr || buffer.empty()) return;
    (void)std::fwrite(buffer.data(), 1, buffer.size(), file);
    (void)std::fflush(file);
    buffer.clear();
  }
};

recorder& rec() {
  static auto* r = new recorder;  // never destroyed: events may come during exit
  return *r;
}

void flush_at_exit() { flush(); }

// Appends an integer in decimal (std::to_chars: no allocation, no locale).
template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Microseconds with three decimals, from nanoseconds.
void append_us(std::string& out, std::int64_t ns) {
  if (ns < 0) out += '-';
  const auto a = static_cast<std::uint64_t>(ns < 0 ? -ns : ns);
  append_int(out, a / 1000);
  const auto frac = static_cast<unsigned>(a % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                          static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out.append(digits, 4);
}

// Starts one event line: {"ph":"X","ts":1.000,"pid":P,"tid":T
void begin_event(std::string& out, char ph, std::int64_t ts_ns, std::int64_t pid,
                 std::int64_t tid) {
  out += "{\"ph\":\"";
  out += ph;
  out += "\",\"ts\":";
  append_us(out, ts_ns);
  out += ",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, tid);
}

void append_line(std::string&& line) {
  auto& r = rec();
  std::lock_guard lk(r.mu);
  r.buffer += line;
  auto now = now_ns();
  if (r.buffer.size() >= flush_bytes || now - r.last_flush >= flush_interval_ns) {
    r.write_locked();
    r.last_flush = now;
  }
}

void append_metadata(std::string_view name, const std::string& args_json) {
  auto& r = rec();
  std::string line;
  begin_event(line, 'M', 0, r.pid, 0);
  line += ",\"name\":";
  append_json_string(line, name);
  line += ",\"args\":{" + args_json + "}},\n";
  append_line(std::move(line));
}

}  // namespace

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int64_t thread_id() noexcept {
  thread_local std::int64_t id = static_cast<std::int64_t>(::syscall(SYS_gettid));
  return id;
}

args& args::add(std::string_view key, std::string_view value) {
  if (!text_.empty()) text_ += ',';
  append_json_string(text_, key);
  text_ += ':';
  append_json_string(text_, value);
  return *this;
}

args& args::add(std::string_view key, std::int64_t value) {
  if (!text_.empty()) text_ += ',';
  append_json_string(text_, key);
  text_ += ':';
  append_int(text_, value);
  return *this;
}

args& args::add(std::string_view key, std::uint64_t value) {
  if (!text_.empty()) text_ += ',';
  append_json_string(text_, key);
  text_ += ':';
  append_int(text_, value);
  return *this;
}

process_options options_from_env() {
  process_options o;
  o.dir = settings::trace.value().value_or("");
  // RANK as every launcher sets it (cluster_env reads it too).
  const char* rank_env = std::getenv("RANK");
  std::optional<std::string> rank;
  if (rank_env != nullptr && *rank_env != '\0') rank = rank_env;
  auto run = settings::run_id.value();
  auto pid = static_cast<std::int64_t>(::getpid());
  o.pid = pid;
  if (rank) {
    char* end = nullptr;
    auto v = std::strtoll(rank->c_str(), &end, 10);
    if (end != rank->c_str() && *end == '\0' && v >= 0) o.pid = v;
  }
  o.file_name = strcat("troupe-", run.value_or("job"), "-rank-", rank.value_or("none"), "-pid-",
                       pid, ".json");
  o.process_name = rank ? strcat("rank ", *rank) : strcat("pid ", pid);
  return o;
}

bool start(const process_options& o) {
  auto& r = rec();
  {
    std::lock_guard lk(r.mu);
    if (r.decided) return detail::state.load() == 2;
    r.decided = true;
    if (o.dir.empty()) {
      detail::state.store(1);
      return false;
    }
    if constexpr (!sites) {
      detail::state.store(1);
      TROUPE_LOG(log_level::warn, "trace",
                 "this build has no trace sites (TROUPE_TRACE_SITES=OFF); ",
                 settings::trace.variable, " is ignored and nothing is traced");
      return false;
    }
    std::error_code ec;
    std::filesystem::create_directories(o.dir, ec);
    auto path = (std::filesystem::path(o.dir) / o.file_name).string();
    std::FILE* f = ec ? nullptr : std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      detail::state.store(1);
      TROUPE_LOG(log_level::warn, "trace", "cannot write the trace file '", path, "' (",
                 ec ? ec.message() : std::string(std::strerror(errno)), "); ",
                 settings::trace.variable, " is ignored and this process runs without tracing");
      return false;
    }
    r.file = f;
    r.path = path;
    r.pid = o.pid;
    r.buffer = "[\n";
    r.last_flush = now_ns();
    r.write_locked();
    std::atexit(flush_at_exit);
    detail::state.store(2);
  }
  append_metadata("process_name", strcat("\"name\":\"", o.process_name, "\""));
  append_metadata("process_sort_index", strcat("\"sort_index\":", o.pid));
  return true;
}

bool detail::start_from_env() noexcept {
  try {
    return start(options_from_env());
  } catch (...) {
    state.store(1);
    return false;
  }
}

void complete(std::string_view category, std::string_view name, std::int64_t start_ns,
              std::int64_t end_ns, const args& a, flow f, std::int64_t tid) {
  if (!enabled()) return;
  auto pid = rec().pid;
  if (tid == 0) tid = thread_id();
  std::string line;
  line.reserve(320 + a.json().size() + 2 * name.size());
  begin_event(line, 'X', start_ns, pid, tid);
  line += ",\"dur\":";
  append_us(line, std::max<std::int64_t>(0, end_ns - start_ns));
  line += ",\"cat\":";
  append_json_string(line, category);
  line += ",\"name\":";
  append_json_string(line, name);
  line += ",\"args\":{";
  line += a.json();
  line += "}},\n";
  auto flow_line = [&](char ph, std::uint64_t id) {
    begin_event(line, ph, start_ns, pid, tid);
    line += ",\"id\":";
    append_int(line, id);
    line += ",\"cat\":";
    append_json_string(line, category);
    line += ",\"name\":";
    append_json_string(line, name);
    line += ph == 'f' ? ",\"bp\":\"e\"},\n" : "},\n";
  };
  if (f.out != 0) flow_line('s', f.out);
  if (f.in != 0) flow_line('f', f.in);
  append_line(std::move(line));
}

void instant(std::string_view category, std::string_view name, const args& a) {
  if (!enabled()) return;
  std::string line;
  begin_event(line, 'i', now_ns(), rec().pid, thread_id());
  line += ",\"s\":\"p\",\"cat\":";
  append_json_string(line, category);
  line += ",\"name\":";
  append_json_string(line, name);
  line += ",\"args\":{" + a.json() + "}},\n";
  append_line(std::move(line));
}

void set_clock(std::int64_t offset_ns, std::int64_t uncertainty_ns, std::string_view how) {
  if (!enabled()) return;
  std::string a =
      strcat("\"offset_ns\":", offset_ns, ",\"uncertainty_ns\":", uncertainty_ns, ",\"how\":");
  append_json_string(a, how);
  append_metadata("troupe_clock", a);
  flush();
}

void flush() noexcept {
  auto& r = rec();
  std::lock_guard lk(r.mu);
  r.write_locked();
  r.last_flush = now_ns();
}

std::string file_path() {
  auto& r = rec();
  std::lock_guard lk(r.mu);
  return r.path;
}

}  // namespace troupe::trace
