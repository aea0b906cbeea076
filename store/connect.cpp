#include <troupe/store/connect.hpp>

#include <sys/random.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <troupe/core/hmac.hpp>
#if TROUPE_HAVE_ETCD
#include <troupe/store/etcd_store.hpp>
#endif
#include <troupe/store/memory_store.hpp>
#include <troupe/store/settings.hpp>
#include <troupe/store/tcp_store.hpp>

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

expected<std::string> make_job_secret() {
  unsigned char raw[32];
  std::size_t got = 0;
  for (int tries = 0; got < sizeof raw && tries < 100; ++tries) {
    auto n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n > 0)
      got += static_cast<std::size_t>(n);
    else if (n < 0 && errno != EINTR)
      break;
  }
  if (got < sizeof raw)
    return make_error(errc::unavailable, "cannot make a job secret: getrandom failed (",
                      std::strerror(errno), ")");
  return to_hex(std::as_bytes(std::span(raw)));
}

expected<std::string> read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::invalid_argument, "cannot read the secret file '", path, "' (",
                      std::strerror(errno), "); give a readable file holding the job's secret");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto first = text.find_first_not_of(" \t\r\n");
  auto last = text.find_last_not_of(" \t\r\n");
  if (first == std::string::npos)
    return make_error(errc::invalid_argument, "the secret file '", path,
                      "' is empty; put the job's secret in it (e.g. openssl rand -hex 32)");
  return text.substr(first, last - first + 1);
}

std::string job_secret_from_env() { return settings::job_secret.value().value_or(std::string()); }

tls::config tls_config_from_env() {
  return tls::config{settings::tls_cert.value().value_or(std::string()),
                     settings::tls_key.value().value_or(std::string()),
                     settings::tls_ca.value().value_or(std::string())};
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
    o.tls = options.tls.enabled() ? options.tls : tls_config_from_env();
    o.connect_timeout = options.connect_timeout;
    o.timeout = options.timeout;
    o.max_frame_size = options.max_frame_size;
    auto s = tcp_store::connect(std::move(o));
    if (!s) return std::move(s).error();
    return std::unique_ptr<store>(std::move(*s));
  }
  if (*scheme == "etcd") {
#if TROUPE_HAVE_ETCD
    auto o = parse_etcd_store_url(url);
    if (!o) return std::move(o).error();
    o->timeout = options.timeout;
    return connect_etcd_store(*o);
#else
    return make_error(errc::invalid_argument, "store URL '", url,
                      "' needs the etcd backend, which this build of troupe leaves out "
                      "(TROUPE_WITH_ETCD=OFF, as the quick start's demo preset does); build "
                      "with `bash scripts/build.sh release` for etcd, or use the embedded store "
                      "(tcp://host:port)");
#endif
  }
  return make_error(errc::invalid_argument, "unknown store URL scheme '", *scheme, "' in '", url,
                    "'; use tcp://host:port, etcd://host:port or memory://");
}

namespace settings {

setting_list store_settings() {
  static constexpr const setting* list[] = {&job_secret, &tls_cert, &tls_key, &tls_ca};
  return list;
}

}  // namespace settings

}  // namespace troupe
