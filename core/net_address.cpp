#include <troupe/core/net_address.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include <troupe/core/cluster_env.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/core/strcat.hpp>

extern char** environ;

namespace troupe {

namespace {

using vars_t = std::map<std::string, std::string>;

bool is_ipv4(std::string_view text) {
  in_addr a{};
  return ::inet_pton(AF_INET, std::string(text).c_str(), &a) == 1;
}

bool is_ip(std::string_view text) {
  in6_addr a6{};
  return is_ipv4(text) || ::inet_pton(AF_INET6, std::string(text).c_str(), &a6) == 1;
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

// The addresses `name` resolves to, IPv4 first; empty when it does not resolve.
std::vector<std::string> resolve_all(const std::string& name) {
  std::vector<std::string> v4, v6;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return {};
  for (addrinfo* p = res; p; p = p->ai_next) {
    std::string a = address_text(p->ai_addr);
    if (a.empty()) continue;
    auto& out = p->ai_family == AF_INET ? v4 : v6;
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  ::freeaddrinfo(res);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

std::string list_interfaces(const host_facts& f) {
  std::string out;
  std::set<std::string> seen;
  for (const auto& i : f.interfaces) {
    if (!seen.insert(i.interface).second) continue;
    std::string first;
    for (const auto& j : f.interfaces)
      if (j.interface == i.interface && is_ipv4(j.address)) {
        first = j.address;
        break;
      }
    out += strcat(out.empty() ? "" : ", ", i.interface, first.empty() ? "" : " (", first,
                  first.empty() ? "" : ")");
  }
  return out.empty() ? std::string("none") : out;
}

bool assigned_here(const host_facts& f, std::string_view address) {
  if (is_loopback_address(address)) return true;
  return std::any_of(f.interfaces.begin(), f.interfaces.end(),
                     [&](const interface_address& i) { return i.address == address; });
}

constexpr const char* how_to_choose =
    "set TROUPE_LOCAL_ADDR to this host's address on the network the hosts share, or "
    "TROUPE_SOCKET_IFNAME to that network's interface (e.g. eth0), or start the job with "
    "troupe-run --local-addr ADDR (docs/multi-node.md)";

expected<std::string> from_local_addr(const host_facts& f, const std::string& value,
                                      std::string_view setting) {
  std::vector<std::string> candidates;
  if (is_ip(value))
    candidates.push_back(value);
  else
    candidates = resolve_all(value);
  if (candidates.empty())
    return make_error(errc::invalid_argument, setting, "='", value,
                      "' is neither an IP address nor a host name that resolves; set it to "
                      "this host's address (its interfaces: ",
                      list_interfaces(f), ")");
  if (value == "0.0.0.0" || value == "::")
    return make_error(errc::invalid_argument, setting, "='", value,
                      "' is not an address other hosts can reach; set it to this host's "
                      "address (its interfaces: ",
                      list_interfaces(f), ")");
  for (const auto& c : candidates)
    if (assigned_here(f, c)) return c;
  return make_error(errc::invalid_argument, setting, "='", value, "'",
                    is_ip(value) ? "" : strcat(" (", candidates.front(), ")"),
                    " is not an address of this host (", f.host_name,
                    "), so nothing here could listen on it; set it to one of this host's "
                    "addresses (its interfaces: ",
                    list_interfaces(f), "), or leave it unset");
}

}  // namespace

bool is_loopback_address(std::string_view host) noexcept {
  if (host == "localhost" || host == "::1" || host == "ip6-localhost") return true;
  return host.starts_with("127.");
}

std::vector<interface_address> host_interface_addresses() {
  std::vector<interface_address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* p = list; p; p = p->ifa_next) {
    if (!p->ifa_addr || !p->ifa_name) continue;
    if (p->ifa_addr->sa_family != AF_INET && p->ifa_addr->sa_family != AF_INET6) continue;
    std::string a = address_text(p->ifa_addr);
    if (!a.empty()) out.push_back({p->ifa_name, std::move(a)});
  }
  ::freeifaddrs(list);
  return out;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::string host_key() {
  char ns[128] = {};
  auto n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  return n > 0 ? strcat(host_name(), " ", std::string_view(ns, static_cast<std::size_t>(n)))
               : host_name();
}

host_facts current_host_facts() {
  host_facts f;
  f.interfaces = host_interface_addresses();
  f.host_name = host_name();
  f.host_name_addresses = resolve_all(f.host_name);
  return f;
}

expected<std::string> interface_ipv4(const host_facts& f, std::string_view ifname,
                                     std::string_view setting) {
  bool exists = false;
  for (const auto& i : f.interfaces) {
    if (i.interface != ifname) continue;
    exists = true;
    if (is_ipv4(i.address)) return i.address;
  }
  return make_error(
      errc::not_found, setting, "='", ifname,
      "': ", exists ? "that interface has no IPv4 address" : "this host has no such interface",
      " (host ", f.host_name, "; its interfaces: ", list_interfaces(f),
      "); name the interface of the network the hosts share");
}

expected<std::string> check_local_address(const host_facts& facts, const std::string& value,
                                          std::string_view setting) {
  return from_local_addr(facts, value, setting);
}

expected<std::string> decide_local_address(const vars_t& vars, const host_facts& f) {
  if (const auto* a = settings::local_addr.find_in(vars))
    return from_local_addr(f, *a, settings::local_addr.variable);
  if (const auto* ifname = settings::socket_ifname.find_in(vars)) {
    auto a = interface_ipv4(f, *ifname, settings::socket_ifname.variable);
    if (!a) return make_error(errc::invalid_argument, a.error().message());
    return a;
  }
  auto env = detect_cluster_env(vars);
  if (!env) {
    if (env.error().code() != errc::not_found) return std::move(env).error();
    // No launcher: nothing says whether the peers are on this host (a dynamic group, a
    // store named by URL). The host name's address when it is assigned here, so that a
    // peer on another host can reach this process; else loopback.
    for (const auto& a : f.host_name_addresses)
      if (is_ipv4(a) && !is_loopback_address(a) && assigned_here(f, a)) return a;
    return std::string("127.0.0.1");
  }
  if (env->local_world_size >= env->world_size) return std::string("127.0.0.1");
  for (const auto& a : f.host_name_addresses)
    if (is_ipv4(a) && !is_loopback_address(a)) return a;
  for (const auto& a : f.host_name_addresses)
    if (!is_loopback_address(a)) return a;
  return make_error(errc::invalid_argument,
                    "cannot tell which address this process offers to the rest of its job: "
                    "the job's ",
                    env->world_size, " ranks do not all run on this host (", env->local_world_size,
                    " here) and the host name '", f.host_name, "' ",
                    f.host_name_addresses.empty()
                        ? std::string("does not resolve")
                        : strcat("resolves only to loopback (", f.host_name_addresses.front(), ")"),
                    "; ", how_to_choose, " (this host's interfaces: ", list_interfaces(f), ")");
}

expected<std::string> local_address() {
  vars_t vars;
  for (char** p = environ; p && *p; ++p) {
    std::string_view entry(*p);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  // Resolving the host name can take a while: only when the decision needs it.
  host_facts f;
  f.interfaces = host_interface_addresses();
  f.host_name = host_name();
  if (!settings::local_addr.find_in(vars) && !settings::socket_ifname.find_in(vars)) {
    auto env = detect_cluster_env(vars);
    bool no_launcher = !env && env.error().code() == errc::not_found;
    if (no_launcher || (env && env->local_world_size < env->world_size))
      f.host_name_addresses = resolve_all(f.host_name);
  }
  return decide_local_address(vars, f);
}

expected<void> check_reachable(std::span<const advertised_address> members,
                               std::string_view group) {
  std::set<std::string> keys;
  std::vector<std::string> names;
  for (const auto& m : members)
    if (keys.insert(m.host_key).second) names.push_back(m.host_name);
  if (keys.size() < 2) return ok();
  std::string hosts;
  for (const auto& n : names) hosts += strcat(hosts.empty() ? "" : ", ", n);
  for (const auto& m : members) {
    if (!is_loopback_address(m.address) && m.address != "0.0.0.0" && m.address != "::") continue;
    return make_error(errc::invalid_argument, group, " spans ", keys.size(), " hosts (", hosts,
                      "), but ", m.who, " on host ", m.host_name, " advertises ", m.address,
                      ", which the other hosts cannot reach; on ", m.host_name,
                      ", set TROUPE_LOCAL_ADDR to the host's address on the network the hosts "
                      "share, or TROUPE_SOCKET_IFNAME to that network's interface (e.g. eth0), "
                      "or start the job with troupe-run --local-addr ADDR (docs/multi-node.md)");
  }
  return ok();
}

std::string local_socket_name(std::string_view service, std::string_view host, std::uint16_t port) {
  return strcat(std::string_view("\0", 1), "troupe-", service, "/", host, ":", port);
}

}  // namespace troupe
