// Merging trace files (core/trace.hpp): every event is one line that starts with
// {"ph":"<phase>","ts":<microseconds>, so the merge shifts timestamps line by line without
// a JSON parser.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <troupe/core/error.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/core/trace.hpp>

namespace troupe::trace {

namespace {

constexpr std::string_view clock_marker = "\"name\":\"troupe_clock\",";
constexpr std::string_view merged_marker = "{\"traceEvents\":";

expected<std::vector<std::string>> read_lines(const std::string& file, bool& merged) {
  std::ifstream in(file);
  if (!in) return make_error(errc::not_found, "cannot read the trace file '", file, "'");
  std::vector<std::string> lines;
  std::string line;
  merged = false;
  bool first = true;
  while (std::getline(in, line)) {
    if (first && line.starts_with(merged_marker)) merged = true;
    first = false;
    while (!line.empty() && (line.back() == ',' || line.back() == ' ' || line.back() == '\r'))
      line.pop_back();
    if (line.starts_with("{\"ph\":\"") && line.back() == '}') lines.push_back(std::move(line));
  }
  return lines;
}

std::optional<std::int64_t> offset_in(const std::vector<std::string>& lines) {
  for (const auto& l : lines) {
    if (l.find(clock_marker) == std::string::npos) continue;
    auto at = l.find("\"offset_ns\":");
    if (at == std::string::npos) continue;
    return std::strtoll(l.c_str() + at + 12, nullptr, 10);
  }
  return std::nullopt;
}

// Parses "123.456" (microseconds, up to three decimals) into nanoseconds.
std::int64_t parse_us(std::string_view s) {
  bool neg = !s.empty() && s.front() == '-';
  if (neg) s.remove_prefix(1);
  std::int64_t whole = 0, frac = 0;
  std::size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) whole = whole * 10 + (s[i] - '0');
  int digits = 0;
  if (i < s.size() && s[i] == '.')
    for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i)
      if (digits < 3) {
        frac = frac * 10 + (s[i] - '0');
        ++digits;
      }
  for (; digits < 3; ++digits) frac *= 10;
  auto ns = whole * 1000 + frac;
  return neg ? -ns : ns;
}

std::string format_us(std::int64_t ns) {
  char buf[32];
  auto a = ns < 0 ? -ns : ns;
  std::snprintf(buf, sizeof buf, "%s%lld.%03lld", ns < 0 ? "-" : "",
                static_cast<long long>(a / 1000), static_cast<long long>(a % 1000));
  return buf;
}

// The line with its timestamp shifted back by `offset` (metadata keeps ts 0).
std::string shifted(const std::string& line, std::int64_t offset) {
  constexpr std::string_view ts_key = ",\"ts\":";
  if (offset == 0 || line.compare(0, 9, "{\"ph\":\"M\"") == 0) return line;
  auto at = line.find(ts_key);
  if (at == std::string::npos) return line;
  auto begin = at + ts_key.size();
  auto end = line.find(',', begin);
  if (end == std::string::npos) return line;
  auto ns = parse_us(std::string_view(line).substr(begin, end - begin));
  return line.substr(0, begin) + format_us(ns - offset) + line.substr(end);
}

}  // namespace

expected<std::int64_t> recorded_offset(const std::string& file) {
  bool merged = false;
  auto lines = read_lines(file, merged);
  if (!lines) return std::move(lines).error();
  auto o = offset_in(*lines);
  if (!o) return make_error(errc::not_found, "the trace file '", file, "' records no clock offset");
  return *o;
}

expected<merge_result> merge_files(const std::vector<std::string>& inputs, const std::string& out,
                                   std::int64_t default_offset_ns) {
  merge_result result;
  const auto tmp = out + ".partial";
  std::ofstream o(tmp, std::ios::trunc);
  if (!o) return make_error(errc::unavailable, "cannot write the merged trace '", tmp, "'");
  o << merged_marker << "[\n";
  bool first = true;
  for (const auto& file : inputs) {
    bool merged = false;
    auto lines = read_lines(file, merged);
    if (!lines) return std::move(lines).error();
    // A merged file is aligned already; a per-process file carries its own offset.
    std::int64_t offset = merged ? 0 : offset_in(*lines).value_or(default_offset_ns);
    for (auto& l : *lines) {
      std::string s = shifted(l, offset);
      if (auto at = s.find(clock_marker); at != std::string::npos)
        s.replace(at, clock_marker.size(), "\"name\":\"troupe_clock_applied\",");
      o << (first ? "" : ",\n") << s;
      first = false;
      ++result.events;
    }
    ++result.files;
  }
  o << "\n],\"displayTimeUnit\":\"ms\"}\n";
  o.close();
  if (!o) return make_error(errc::unavailable, "cannot write the merged trace '", tmp, "'");
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec)
    return make_error(errc::unavailable, "cannot write the merged trace '", out,
                      "': ", ec.message());
  return result;
}

}  // namespace troupe::trace
