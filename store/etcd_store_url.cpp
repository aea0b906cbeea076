// parse_etcd_store_url (etcd_store.hpp): an etcd:// store URL into etcd_store_options,
// with its %-escaped options and the password read from its file.
#include <troupe/store/etcd_store.hpp>

#include <charconv>
#include <fstream>

#include <troupe/core/strcat.hpp>
#include <troupe/store/etcd_http.hpp>

namespace troupe {

namespace {

expected<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size())
      return make_error(errc::invalid_argument, "truncated %-escape in '", text, "'");
    unsigned v = 0;
    auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, v, 16);
    if (ec != std::errc{} || end != text.data() + i + 3)
      return make_error(errc::invalid_argument, "bad %-escape in '", text, "'");
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// The password in `path`: its first line, without the line end.
expected<std::string> read_password_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return make_error(errc::invalid_argument, "cannot read the etcd password file '", path, "'");
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.empty())
    return make_error(errc::invalid_argument, "the etcd password file '", path,
                      "' is empty; its first line is the password");
  return line;
}

}  // namespace

expected<etcd_store_options> parse_etcd_store_url(std::string_view url) {
  constexpr std::string_view scheme = "etcd://";
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "store URL '", url, "': ", why,
                      "; write etcd://host:port[,host:port]/prefix[?lease_ttl=10s]");
  };
  if (!url.starts_with(scheme)) return bad("it does not start with etcd://");
  std::string_view rest = url.substr(scheme.size());
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view hosts = rest.substr(0, rest.find('/'));
  std::string_view path = hosts.size() < rest.size() ? rest.substr(hosts.size()) : "";
  etcd_store_options o;
  o.endpoints.clear();
  while (!hosts.empty()) {
    auto comma = hosts.find(',');
    std::string_view one = hosts.substr(0, comma);
    auto ep = detail::parse_etcd_endpoint(one);
    if (!ep) return std::move(ep).error();
    o.endpoints.push_back(std::string(one));
    hosts = comma == std::string_view::npos ? std::string_view{} : hosts.substr(comma + 1);
  }
  if (o.endpoints.empty()) return bad("no host:port");
  while (path.starts_with('/')) path.remove_prefix(1);
  if (!path.empty()) o.prefix = "/" + std::string(path);
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    auto eq = item.find('=');
    std::string_view name = item.substr(0, eq);
    auto decoded = percent_decode(eq == std::string_view::npos ? "" : item.substr(eq + 1));
    if (!decoded) return bad(strcat("option '", name, "' has a bad %-escape"));
    std::string_view value = *decoded;
    auto path_value = [&](std::string& out) -> expected<void> {
      if (value.empty()) return bad(strcat("option '", name, "' needs a file path"));
      out = std::string(value);
      return ok();
    };
    if (name == "protocol" && (value == "http" || value == "https")) {
      o.tls.enabled = value == "https";
    } else if (name == "cacert") {
      if (auto r = path_value(o.tls.ca_file); !r) return std::move(r).error();
    } else if (name == "cert") {
      if (auto r = path_value(o.tls.cert_file); !r) return std::move(r).error();
    } else if (name == "key") {
      if (auto r = path_value(o.tls.key_file); !r) return std::move(r).error();
    } else if (name == "user") {
      if (value.empty()) return bad("option 'user' needs a name");
      o.user = std::string(value);
    } else if (name == "password_file") {
      std::string file;
      if (auto r = path_value(file); !r) return std::move(r).error();
      auto password = read_password_file(file);
      if (!password) return std::move(password).error();
      o.password = std::move(*password);
    } else if (name == "lease_ttl") {
      auto ttl = parse_duration(value);
      if (!ttl) return std::move(ttl).error();
      o.lease_ttl = *ttl;
    } else if (name == "attach_lease" && (value == "true" || value == "false")) {
      o.attach_lease = value == "true";
    } else {
      return bad(strcat("unknown option '", item, "' (known: lease_ttl=<duration>, ",
                        "attach_lease=true|false, protocol=http|https, cacert=PATH, cert=PATH, "
                        "key=PATH, user=NAME, password_file=PATH)"));
    }
  }
  if (!o.user.empty() && o.password.empty())
    return bad(strcat("user '", o.user, "' needs password_file=PATH"));
  return o;
}

}  // namespace troupe
