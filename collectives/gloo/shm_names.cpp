#include <troupe/collectives/gloo/shm_names.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <vector>

#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

constexpr std::string_view prefix = "troupe-";

template <class T>
bool parse_name_part(std::string_view s, T& out, int base) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::string token_hex(std::uint64_t token) {
  char buf[17];
  auto [p, ec] = std::to_chars(buf, buf + 16, token, 16);
  return std::string(buf, p);
}

std::optional<proc_state> read_proc(int pid) {
  std::ifstream f(strcat("/proc/", pid, "/stat"));
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses; fields after the last
  // ')' are state (3rd field of the line) ... starttime (22nd).
  auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string_view> fields;
  std::string_view rest(line);
  rest.remove_prefix(close + 1);
  while (!rest.empty()) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    auto end = rest.find(' ');
    fields.push_back(rest.substr(0, end));
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end);
  }
  if (fields.size() < 20) return std::nullopt;
  proc_state s;
  s.running = fields[0] != "Z" && fields[0] != "X";
  auto st = fields[19];
  std::from_chars(st.data(), st.data() + st.size(), s.start);
  return s;
}

std::uint64_t pid_namespace() {
  char buf[64] = {};
  auto n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  if (n <= 0) return 0;
  std::string_view s(buf, static_cast<std::size_t>(n));  // "pid:[4026531836]"
  auto open = s.find('[');
  std::uint64_t ino = 0;
  if (open != std::string_view::npos)
    std::from_chars(s.data() + open + 1, s.data() + s.size(), ino);
  return ino;
}

std::string segment_name(std::uint64_t token) {
  auto me = read_proc(::getpid());
  return strcat("/", prefix, ::getpid(), "-", me ? me->start : 0, "-", pid_namespace(), "-",
                token_hex(token));
}

std::string pipe_path(const std::string& name, int from, int to) {
  return strcat("/dev/shm", name, ".", from, ".", to);
}

std::optional<segment_maker> parse_segment_name(std::string_view file) {
  if (file.substr(0, prefix.size()) != prefix) return std::nullopt;
  // A segment's pipe: the segment's name, then ".<from>.<to>".
  if (auto dot = file.find('.'); dot != std::string_view::npos) {
    auto pair = file.substr(dot + 1);
    auto second = pair.find('.');
    int from = 0, to = 0;
    if (second == std::string_view::npos || !parse_name_part(pair.substr(0, second), from, 10) ||
        !parse_name_part(pair.substr(second + 1), to, 10) || from < 0 || to < 0)
      return std::nullopt;
    file = file.substr(0, dot);
  }
  file.remove_prefix(prefix.size());
  std::string_view part[4];
  for (int i = 0; i < 4; ++i) {
    auto dash = file.find('-');
    if ((dash == std::string_view::npos) != (i == 3)) return std::nullopt;
    part[i] = file.substr(0, dash);
    if (dash != std::string_view::npos) file.remove_prefix(dash + 1);
  }
  segment_maker m;
  std::uint64_t token = 0;
  if (!parse_name_part(part[0], m.pid, 10) || m.pid <= 0 ||
      !parse_name_part(part[1], m.start, 10) || !parse_name_part(part[2], m.pid_ns, 10) ||
      !parse_name_part(part[3], token, 16))
    return std::nullopt;
  return m;
}

int sweep_dead_segments(const std::string& dir) {
  const auto ns = pid_namespace();
  if (ns == 0) return 0;  // without /proc, no maker can be told gone
  int removed = 0;
  std::error_code ec;
  // Bounded: one pass over the directory as it is now.
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    auto file = e.path().filename().string();
    auto maker = parse_segment_name(file);
    if (!maker || maker->pid_ns != ns || maker->pid == ::getpid()) continue;
    auto p = read_proc(maker->pid);
    if (p && p->running && p->start == maker->start) continue;  // its maker still runs
    if (::shm_unlink(("/" + file).c_str()) == 0) {
      ++removed;
      TROUPE_LOG(log_level::info, "collectives", "removed /dev/shm/", file, ": its maker (pid ",
                 maker->pid, ") is gone; it was killed while its group was being created");
    }
  }
  return removed;
}

}  // namespace troupe::collectives::gloo_shm
