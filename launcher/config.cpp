#include <troupe/launcher/config.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <filesystem>
#include <thread>

#include <troupe/core/cuda_runtime.hpp>
#include <troupe/store/connect.hpp>

namespace troupe::launcher {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool to_int(std::string_view s, int& out) {
  s = trim(s);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

error bad(std::string_view flag, std::string_view value, std::string_view accepted) {
  return make_error(errc::invalid_argument, flag, ": '", value, "' is not valid; ", accepted);
}

int cpu_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace

const std::vector<rdzv_conf_key>& rdzv_conf_keys() {
  static const std::vector<rdzv_conf_key> keys{
      {"timeout", rdzv_conf_setting::join_timeout, false},
      {"join_timeout", rdzv_conf_setting::join_timeout, false},
      {"last_call_timeout", rdzv_conf_setting::last_call, false},
      {"last_call", rdzv_conf_setting::last_call, false},
      {"heartbeat_timeout", rdzv_conf_setting::heartbeat_timeout, false},
      {"exit_barrier_timeout", rdzv_conf_setting::exit_barrier_timeout, false},
      {"is_host", rdzv_conf_setting::is_host, false},
      {"local_addr", rdzv_conf_setting::local_addr, false},
      {"protocol", rdzv_conf_setting::etcd_protocol, false},
      {"cacert", rdzv_conf_setting::etcd_cacert, false},
      {"cert", rdzv_conf_setting::etcd_cert, false},
      {"key", rdzv_conf_setting::etcd_key, false},
      {"user", rdzv_conf_setting::etcd_user, false},
      {"password_file", rdzv_conf_setting::etcd_password_file, false},
      {"read_timeout", rdzv_conf_setting::ignored, true},
      {"keep_alive_interval", rdzv_conf_setting::ignored, true},
      {"store_type", rdzv_conf_setting::ignored, true},
  };
  return keys;
}

const rdzv_conf_key* find_rdzv_conf_key(std::string_view name) {
  for (const auto& k : rdzv_conf_keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::string rdzv_conf_key_list() {
  std::string out;
  const auto& keys = rdzv_conf_keys();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) out += i + 1 == keys.size() ? " and " : ", ";
    out += keys[i].name;
    if (keys[i].torchrun_only) out += " (accepted, unused)";
  }
  return out;
}

std::string_view to_string(rdzv_backend b) noexcept {
  switch (b) {
    case rdzv_backend::fixed:
      return "static";
    case rdzv_backend::store:
      return "store";
    case rdzv_backend::etcd:
      return "etcd";
  }
  return "?";
}

int stream_selection::for_local_rank(int local_rank) const {
  if (auto it = per_local_rank.find(local_rank); it != per_local_rank.end()) return it->second;
  return per_local_rank.empty() ? all : 0;
}

expected<int> parse_flag_int(std::string_view flag, std::string_view text, int min, int max) {
  int v = 0;
  if (!to_int(text, v) || v < min || v > max)
    return bad(flag, text, strcat("write an integer from ", min, " to ", max));
  return v;
}

expected<duration> parse_flag_duration(std::string_view flag, std::string_view text) {
  auto d = parse_duration(trim(text));
  if (!d)
    return bad(
        flag, text,
        "write a duration such as 250ms, 5s, 2m or seconds as torchrun takes them (0.1, 30)");
  return *d;
}

expected<node_range> parse_nnodes(std::string_view text) {
  constexpr std::string_view accepted = "write N or MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 1:4)";
  node_range r;
  if (auto colon = text.find(':'); colon == std::string_view::npos) {
    if (!to_int(text, r.min) || r.min < 1) return bad("--nnodes", text, accepted);
    r.max = r.min;
  } else {
    if (!to_int(text.substr(0, colon), r.min) || !to_int(text.substr(colon + 1), r.max) ||
        r.min < 1 || r.max < r.min)
      return bad("--nnodes", text, accepted);
  }
  return r;
}

expected<int> parse_nproc_per_node(std::string_view text) {
  text = trim(text);
  if (text == "cpu") return cpu_count();
  if (text == "gpu") {
    auto n = cuda_device_count();
    if (!n)
      return make_error(errc::unavailable, "--nproc-per-node: 'gpu' needs a CUDA device, but ",
                        n.error().message(), "; give a count or 'cpu' instead");
    return *n;
  }
  if (text == "auto") {
    auto n = cuda_device_count();
    return n ? *n : cpu_count();
  }
  int v = 0;
  if (!to_int(text, v) || v < 1 || v > 4096)
    return bad("--nproc-per-node", text, "write auto, cpu, gpu or a count from 1 to 4096");
  return v;
}

expected<rdzv_backend> parse_rdzv_backend(std::string_view text) {
  text = trim(text);
  if (text == "static") return rdzv_backend::fixed;
  if (text == "store" || text == "c10d" || text == "tcp") return rdzv_backend::store;
  if (text == "etcd" || text == "etcd-v2" || text == "etcd-v3") return rdzv_backend::etcd;
  return bad("--rdzv-backend", text, "write static, store (alias c10d) or etcd");
}

expected<std::string> check_program(std::string_view program, const char* path_env) {
  auto check = [](const std::string& file) -> expected<void> {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0)
      return make_error(errc::not_found, "the worker program '", file,
                        "' does not exist; check its spelling and path");
    if (!S_ISREG(st.st_mode))
      return make_error(errc::invalid_argument, "the worker program '", file,
                        "' is not a regular file");
    if (::access(file.c_str(), X_OK) != 0)
      return make_error(errc::invalid_argument, "the worker program '", file,
                        "' is not executable; chmod +x it or name its interpreter first");
    return ok();
  };
  if (program.find('/') != std::string_view::npos) {
    TROUPE_TRY(check(std::string(program)));
    return std::string(program);
  }
  std::string_view dirs = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = dirs.find(':');
    std::string_view dir = dirs.substr(0, colon);
    std::string file = strcat(dir.empty() ? "." : dir, "/", program);
    if (check(file)) return file;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return make_error(errc::not_found, "the worker program '", program,
                    "' is not found on PATH; check its spelling, or give a path such as ./",
                    program);
}

expected<std::vector<int>> parse_local_ranks_filter(std::string_view text) {
  std::vector<int> out;
  std::string_view rest = trim(text);
  while (!rest.empty()) {
    auto comma = rest.find(',');
    int v = 0;
    if (!to_int(rest.substr(0, comma), v) || v < 0)
      return bad("--local-ranks-filter", text,
                 "write local ranks separated by commas (e.g. 0 or 0,2)");
    out.push_back(v);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return out;
}

expected<std::map<std::string, std::string>> parse_rdzv_conf(std::string_view text) {
  std::map<std::string, std::string> out;
  std::string_view rest = text;
  while (!trim(rest).empty()) {
    auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    auto eq = item.find('=');
    if (eq == std::string_view::npos || trim(item.substr(0, eq)).empty())
      return bad(
          "--rdzv-conf", text,
          strcat("the entry '", item, "' is not key=value; write k=v,k=v (e.g. timeout=60s)"));
    out[std::string(trim(item.substr(0, eq)))] = std::string(trim(item.substr(eq + 1)));
  }
  return out;
}

expected<stream_selection> parse_stream_selection(std::string_view flag, std::string_view text) {
  const std::string accepted =
      "write 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local rank as "
      "local_rank:value,... (e.g. 0:1,1:3)";
  stream_selection s;
  if (text.find(':') == std::string_view::npos) {
    if (!to_int(text, s.all) || s.all < 0 || s.all > 3) return bad(flag, text, accepted);
    return s;
  }
  std::string_view rest = text;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    auto colon = item.find(':');
    int rank = 0;
    int bits = 0;
    if (colon == std::string_view::npos || !to_int(item.substr(0, colon), rank) || rank < 0 ||
        !to_int(item.substr(colon + 1), bits) || bits < 0 || bits > 3)
      return bad(flag, text, accepted);
    s.per_local_rank[rank] = bits;
  }
  return s;
}

namespace {

// Escapes what a store URL's query cannot carry as is.
std::string query_escape(std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (std::isalnum(u) || ch == '/' || ch == '.' || ch == '-' || ch == '_' || ch == '~') {
      out += ch;
    } else {
      out += '%';
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

}  // namespace

std::string etcd_store_url(const run_config& c) {
  std::string_view endpoint = c.rdzv_endpoint;
  for (std::string_view scheme : {"http://", "https://"})
    if (endpoint.starts_with(scheme)) endpoint.remove_prefix(scheme.size());
  std::string url = strcat("etcd://", endpoint);
  std::string query;
  auto add = [&](std::string_view name, const std::string& value) {
    if (value.empty()) return;
    query += strcat(query.empty() ? "?" : "&", name, "=", query_escape(value));
  };
  if (c.etcd_https) query += "?protocol=https";
  add("cacert", c.etcd_cacert);
  add("cert", c.etcd_cert);
  add("key", c.etcd_key);
  add("user", c.etcd_user);
  add("password_file", c.etcd_password_file);
  return url + query;
}

expected<void> finish_config(run_config& c) {
  if (c.program.empty())
    return make_error(errc::invalid_argument,
                      "no worker executable given; write troupe-run [flags] PROGRAM [ARGS...]");
  if (c.standalone) {
    if (c.nnodes.min != 1 || c.nnodes.max != 1)
      return make_error(errc::invalid_argument, "--standalone runs one node, but --nnodes is ",
                        c.nnodes.min, ":", c.nnodes.max, "; drop one of them");
    if (!c.rdzv_endpoint.empty())
      return make_error(errc::invalid_argument,
                        "--standalone starts its own store; it cannot be combined with "
                        "--rdzv-endpoint '",
                        c.rdzv_endpoint, "'");
    c.backend = rdzv_backend::store;
  }
  for (const auto& [key, value] : c.rdzv_conf) {
    const rdzv_conf_key* known = find_rdzv_conf_key(key);
    if (known == nullptr)
      return make_error(errc::invalid_argument, "--rdzv-conf: unknown key '", key,
                        "'; known keys are ", rdzv_conf_key_list());
    const std::string flag = strcat("--rdzv-conf ", known->name);
    duration* target = nullptr;
    switch (known->what) {
      case rdzv_conf_setting::join_timeout:
        target = &c.join_timeout;
        break;
      case rdzv_conf_setting::last_call:
        target = &c.last_call;
        break;
      case rdzv_conf_setting::heartbeat_timeout:
        target = &c.heartbeat_timeout;
        break;
      case rdzv_conf_setting::exit_barrier_timeout:
        target = &c.exit_barrier_timeout;
        break;
      case rdzv_conf_setting::is_host:
        if (value == "true" || value == "1" || value == "yes") {
          c.is_host = 1;
        } else if (value == "false" || value == "0" || value == "no") {
          c.is_host = 0;
        } else {
          return bad(flag, value, "write true or false");
        }
        break;
      case rdzv_conf_setting::local_addr:
        if (value.empty()) return bad(flag, value, "write a host name or address");
        c.local_addr = value;
        break;
      case rdzv_conf_setting::etcd_protocol:
        if (value != "http" && value != "https") return bad(flag, value, "write http or https");
        c.etcd_https = value == "https";
        break;
      case rdzv_conf_setting::etcd_cacert:
      case rdzv_conf_setting::etcd_cert:
      case rdzv_conf_setting::etcd_key:
      case rdzv_conf_setting::etcd_password_file: {
        if (value.empty()) return bad(flag, value, "write a file path");
        std::error_code ec;
        auto path = std::filesystem::absolute(value, ec);
        if (ec || !std::filesystem::is_regular_file(path, ec))
          return bad(flag, value,
                     "no such file; give a readable PEM file (or, for "
                     "password_file, a file whose first line is the password)");
        std::string& out = known->what == rdzv_conf_setting::etcd_cacert ? c.etcd_cacert
                           : known->what == rdzv_conf_setting::etcd_cert ? c.etcd_cert
                           : known->what == rdzv_conf_setting::etcd_key  ? c.etcd_key
                                                                         : c.etcd_password_file;
        out = path.string();
        break;
      }
      case rdzv_conf_setting::etcd_user:
        if (value.empty()) return bad(flag, value, "write the etcd user's name");
        c.etcd_user = value;
        break;
      case rdzv_conf_setting::ignored:
        break;  // accepted for torchrun compatibility; troupe-run has no use for it
    }
    if (known->what >= rdzv_conf_setting::etcd_protocol &&
        known->what <= rdzv_conf_setting::etcd_password_file && c.backend != rdzv_backend::etcd)
      return make_error(errc::invalid_argument, flag,
                        " applies to --rdzv-backend etcd only (this "
                        "job's backend is ",
                        to_string(c.backend), ")");
    if (target != nullptr) {
      auto d = parse_flag_duration(flag, value);
      if (!d) return std::move(d).error();
      *target = *d;
    }
  }
  if (c.heartbeat_timeout > duration::zero() && c.heartbeat_timeout < 4 * c.monitor_interval)
    return make_error(errc::invalid_argument,
                      "--rdzv-conf heartbeat_timeout=", format_duration(c.heartbeat_timeout),
                      " is too short for --monitor-interval ", format_duration(c.monitor_interval),
                      ": heartbeats are checked once per interval, so the timeout must be at "
                      "least 4 intervals (or 0 to turn heartbeats off)");
  if (c.backend == rdzv_backend::fixed) {
    if (c.nnodes.elastic())
      return make_error(errc::invalid_argument, "--nnodes ", c.nnodes.min, ":", c.nnodes.max,
                        " is elastic, which --rdzv-backend static cannot do; use store or etcd");
    if (c.nnodes.max > 1 && c.node_rank < 0)
      return make_error(errc::invalid_argument, "--rdzv-backend static with --nnodes ",
                        c.nnodes.max, " needs --node-rank (0 to ", c.nnodes.max - 1, ")");
    if (c.node_rank < 0) c.node_rank = 0;
  } else if (!c.standalone) {
    if (c.rdzv_endpoint.empty())
      return make_error(errc::invalid_argument, "--rdzv-backend ", to_string(c.backend),
                        " needs --rdzv-endpoint host:port");
    std::string_view endpoint = c.rdzv_endpoint;
    if (endpoint.starts_with("https://") && c.backend != rdzv_backend::etcd)
      return make_error(errc::invalid_argument, "--rdzv-endpoint: '", c.rdzv_endpoint,
                        "' asks for TLS, which the ", to_string(c.backend),
                        " backend does not speak (its store authenticates with the job secret); "
                        "write host:port, or use --rdzv-backend etcd with an https etcd");
    if (c.backend == rdzv_backend::etcd && endpoint.starts_with("https://")) {
      endpoint.remove_prefix(8);  // an etcd client URL over TLS
      c.etcd_https = true;
    } else if (c.backend == rdzv_backend::etcd && endpoint.starts_with("http://")) {
      endpoint.remove_prefix(7);  // an etcd client URL; the etcd client reads the same
    }
    auto hp = parse_host_port(endpoint);
    if (!hp)
      return bad("--rdzv-endpoint", c.rdzv_endpoint,
                 c.backend == rdzv_backend::etcd
                     ? "write host:port or http://host:port (e.g. 10.0.0.1:2379)"
                     : "write host:port (e.g. 10.0.0.1:29400)");
  }
  if (c.node_rank >= c.nnodes.max)
    return make_error(errc::invalid_argument, "--node-rank: ", c.node_rank,
                      " is not valid; with --nnodes ", c.nnodes.max, " it must be 0 to ",
                      c.nnodes.max - 1);
  if (c.rdzv_id.empty() && c.nnodes.max > 1)
    return make_error(errc::invalid_argument, "--nnodes ", c.nnodes.min, ":", c.nnodes.max,
                      " is a job of several nodes, which must share an id: give every node the "
                      "same --rdzv-id (or PET_RDZV_ID), e.g. the scheduler's job id; without one, "
                      "two jobs on the same endpoint could mix");
  if (c.role.empty()) return bad("--role", c.role, "write a non-empty name");
  if (c.log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    c.log_dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/troupe-run";
  }
  return ok();
}

}  // namespace troupe::launcher
