#include "store/connect.hpp"

#include <charconv>
#include <cstdlib>

#include "store/etcd_store.hpp"
#include "store/memory_store.hpp"
#include "store/tcp_store.hpp"

namespace troupe {

expected<std::string> store_url_scheme(std::string_view url) {
  auto sep = url.find("://");
  if (sep == std::string_view::npos || sep == 0)
    return make_error(errc::invalid_argument, "store URL '", url,
                      "' has no scheme; write tcp://host:port, etcd://host:port or memory://");
  return std::string(url.substr(0, sep));
}

expected<std::pair<std::string, std::uint16_t>> parse_host_port(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "'", text, "' is not host:port (", why,
                      "); write e.g. 127.0.0.1:29500 or [::1]:29500");
  };
  std::string host;
  std::string_view port_text;
  if (text.starts_with('[')) {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return bad("an IPv6 address needs [address]:port");
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("the port is missing");
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) return bad("the host is empty");
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || p != port_text.data() + port_text.size() ||
      port > 65535)
    return bad("the port must be a number from 0 to 65535");
  return std::pair{std::move(host), static_cast<std::uint16_t>(port)};
}

std::string job_secret_from_env() {
  for (const char* name : {"TROUPE_JOB_SECRET", "TROUPE_STORE_SECRET"})
    if (const char* v = std::getenv(name); v && *v) return v;
  return {};
}

expected<std::unique_ptr<store>> connect_store(std::string_view url, const store_options& options) {
  auto scheme = store_url_scheme(url);
  if (!scheme) return std::move(scheme).error();
  std::string_view rest = url.substr(scheme->size() + 3);
  if (*scheme == "memory") {
    std::unique_ptr<memory_store> s =
        rest.empty() ? std::make_unique<memory_store>() : memory_store::named(rest);
    s->set_timeout(options.timeout);
    return std::unique_ptr<store>(std::move(s));
  }
  if (*scheme == "tcp") {
    while (rest.ends_with('/')) rest.remove_suffix(1);
    auto hp = parse_host_port(rest);
    if (!hp) return std::move(hp).error();
    if (hp->second == 0)
      return make_error(errc::invalid_argument, "store URL '", url,
                        "' has port 0; name the port the server printed");
    tcp_store_options o;
    o.host = std::move(hp->first);
    o.port = hp->second;
    o.secret = options.secret;
    if (o.secret.empty()) o.secret = job_secret_from_env();
    o.connect_timeout = options.connect_timeout;
    o.timeout = options.timeout;
    o.max_frame_size = options.max_frame_size;
    auto s = tcp_store::connect(std::move(o));
    if (!s) return std::move(s).error();
    return std::unique_ptr<store>(std::move(*s));
  }
  if (*scheme == "etcd") {
    auto o = parse_etcd_store_url(url);
    if (!o) return std::move(o).error();
    o->timeout = options.timeout;
    return connect_etcd_store(*o);
  }
  return make_error(errc::invalid_argument, "unknown store URL scheme '", *scheme, "' in '", url,
                    "'; use tcp://host:port, etcd://host:port or memory://");
}

}  // namespace troupe
