#include <troupe/store/cluster_store.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <cstdlib>

#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace troupe {

namespace {

// The server (when this process hosts it) and the client, released client first.
struct holder {
  std::unique_ptr<tcp_store_server> server;
  std::unique_ptr<store> client;
};

// Who is expected to host the store, for messages.
std::string who_hosts(const cluster_env& env) {
  if (env.store_at_master)
    return strcat("rank 0 hosts it under ", to_string(env.kind),
                  "-style launch; is rank 0 running, and is MASTER_ADDR its address");
  if (env.kind == cluster_kind::troupe_run)
    return "troupe-run hosts it (TROUPE_STORE_URL); is the job's troupe-run (or, across "
           "nodes, the rendezvous store) still running";
  return "the store server TROUPE_STORE_URL names should run there; is it running";
}

// The first address `host` resolves to, or an error naming `setting`.
expected<std::string> resolve(const std::string& host, std::string_view setting) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return make_error(errc::invalid_argument, setting, "='", host, "' does not resolve (",
                      ::gai_strerror(rc),
                      "); set it to the address (or a resolvable name) of the host of rank 0");
  // IPv4 first, as the clients' connect and the servers' default binds are.
  const addrinfo* pick = res;
  for (const addrinfo* p = res; p; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      pick = p;
      break;
    }
  char buf[NI_MAXHOST] = {};
  int n =
      ::getnameinfo(pick->ai_addr, pick->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(res);
  if (n != 0) return make_error(errc::invalid_argument, setting, "='", host, "' does not resolve");
  return std::string(buf);
}

}  // namespace

expected<cluster_store> open_cluster_store(const cluster_env& env, duration timeout) {
  cluster_store out;
  out.scope = env.store_scope;
  auto h = std::make_shared<holder>();
  if (env.store_url.empty()) {
    if (env.world_size > 1)
      return make_error(errc::not_found, "the ", to_string(env.kind),
                        " environment names no store for a world of ", env.world_size,
                        ": set MASTER_ADDR and MASTER_PORT (rank 0 hosts the store there) or "
                        "TROUPE_STORE_URL");
    h->client = std::make_unique<memory_store>();
    out.url = "memory://";
  } else {
    out.url = env.store_url;
    auto scheme = store_url_scheme(env.store_url);
    if (!scheme) return std::move(scheme).error();
    const std::string_view setting = env.store_at_master ? "MASTER_ADDR" : "TROUPE_STORE_URL";
    std::string where = env.store_url.substr(scheme->size() + 3);
    if (*scheme == "tcp") {
      auto hp = parse_host_port(where);
      if (!hp) return std::move(hp).error();
      auto addr = resolve(hp->first, setting);
      if (!addr) return std::move(addr).error();
      // Loopback reaches no other host: a job whose ranks are not all here cannot meet at
      // MASTER_ADDR, unless this process was told it stays on loopback (several nodes
      // simulated on one host: TROUPE_LOCAL_ADDR=127.0.0.1). A launcher's own URL is
      // trusted (troupe-run gives a loopback one only to nodes on one host).
      const auto local = settings::local_addr.value();
      if (env.store_at_master && is_loopback_address(*addr) &&
          env.local_world_size < env.world_size && !(local && is_loopback_address(*local)))
        return make_error(errc::invalid_argument, setting, "='", hp->first, "' is loopback (",
                          *addr, "), but only ", env.local_world_size, " of the job's ",
                          env.world_size,
                          " ranks run on this host; set it to the address of the host of rank "
                          "0 that the other hosts reach (to run several nodes on one host, set "
                          "TROUPE_LOCAL_ADDR=127.0.0.1)");
      if (env.host_store) {
        // Bind MASTER_ADDR itself when it is this host's, else every interface (a name
        // that other hosts resolve differently, or an address behind NAT).
        tcp_store_server_options so;
        so.port = hp->second;
        so.secret = job_secret_from_env();
        so.tls = tls_config_from_env();
        so.host = "0.0.0.0";
        if (is_loopback_address(*addr)) {
          so.host = *addr;
        } else {
          for (const auto& i : host_interface_addresses())
            if (i.address == *addr) so.host = *addr;
        }
        auto server = tcp_store_server::start(so);
        if (!server)
          return make_error(server.error().code(), "rank 0 cannot host the job's store on ",
                            so.host, ":", so.port, " (MASTER_PORT): ", server.error().message(),
                            "; is another job using that port? Choose a free MASTER_PORT");
        TROUPE_LOG(log_level::info, "store", "rank 0 hosts the job's store on ", so.host, ":",
                   so.port);
        h->server = std::move(*server);
      }
    }
    store_options so;
    so.timeout = timeout;
    so.connect_timeout = timeout;
    auto s = connect_store(env.store_url, so);
    if (!s) {
      if (s.error().code() == errc::timeout)
        return make_error(errc::timeout, "no store at ", where, " after ", format_duration(timeout),
                          ": ", who_hosts(env), "? (", s.error().message(), ")")
            .with_operation("store.open");
      return make_error(s.error().code(), "cannot open the job's store at ", where, ": ",
                        s.error().message())
          .with_operation("store.open");
    }
    h->client = std::move(*s);
  }
  out.hosted = h->server != nullptr;
  out.base = std::shared_ptr<store>(h, h->client.get());
  out.scoped = out.scope.empty() ? out.base : std::make_shared<prefix_store>(out.base, out.scope);
  return out;
}

}  // namespace troupe
