#include "support/etcd_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace troupe::test {

namespace {

// A port that was free a moment ago: bind port 0, read the port back, close. Another
// process may take it before etcd binds it; start() retries on that clash.
std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  std::uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// Whether etcd answers GET /health on 127.0.0.1:port with a healthy status.
bool healthy(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char request[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request, sizeof request - 1, MSG_NOSIGNAL) ==
        static_cast<ssize_t>(sizeof request - 1)) {
      std::string reply;
      char buf[1024];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, n);
      ok = reply.find("\"health\":\"true\"") != std::string::npos;
    }
  }
  ::close(fd);
  return ok;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail(const std::string& text, std::size_t n = 1500) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

}  // namespace

std::string etcd_server::binary() {
  if (const char* env = std::getenv("TROUPE_ETCD_BINARY"); env && *env) return env;
  return "/usr/bin/etcd";
}

bool etcd_server::available() { return ::access(binary().c_str(), X_OK) == 0; }

std::string etcd_server::skip_reason() {
  return "etcd is not installed (no executable " + binary() +
         "); run the project's install script (it installs Debian's etcd-server), or set "
         "TROUPE_ETCD_BINARY";
}

expected<std::unique_ptr<etcd_server>> etcd_server::start(duration timeout) {
  return start(etcd_server_options{}, timeout);
}

expected<std::unique_ptr<etcd_server>> etcd_server::start(const etcd_server_options& options,
                                                          duration timeout) {
  if (!available()) return make_error(errc::unavailable, skip_reason());
  const auto until = deadline::after(timeout);
  std::string last_log;
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::unique_ptr<etcd_server> s(new etcd_server());
    s->client_port_ = free_port();
    s->peer_port_ = free_port();
    s->metrics_port_ = free_port();
    s->tls_ = !options.cert_file.empty();
    if (s->client_port_ == 0 || s->peer_port_ == 0 || s->metrics_port_ == 0 ||
        s->client_port_ == s->peer_port_ || s->metrics_port_ == s->client_port_ ||
        s->metrics_port_ == s->peer_port_)
      continue;
    char dir_template[] = "/tmp/troupe-etcd-XXXXXX";
    if (!::mkdtemp(dir_template))
      return make_error(errc::unavailable, "cannot create a data directory under /tmp");
    s->data_dir_ = dir_template;
    s->log_path_ = s->data_dir_ + "/etcd.log";
    const std::string client = s->url();
    const std::string peer = "http://127.0.0.1:" + std::to_string(s->peer_port_);
    s->args_ = {binary(),
                "--name=troupe-test",
                "--data-dir=" + s->data_dir_ + "/data",
                "--listen-client-urls=" + client,
                "--advertise-client-urls=" + client,
                "--listen-peer-urls=" + peer,
                "--initial-advertise-peer-urls=" + peer,
                "--initial-cluster=troupe-test=" + peer,
                "--initial-cluster-state=new",
                "--listen-metrics-urls=http://127.0.0.1:" + std::to_string(s->metrics_port_),
                "--log-level=warn"};
    if (s->tls_) {
      s->args_.push_back("--cert-file=" + options.cert_file);
      s->args_.push_back("--key-file=" + options.key_file);
      if (!options.client_ca_file.empty()) {
        s->args_.push_back("--client-cert-auth");
        s->args_.push_back("--trusted-ca-file=" + options.client_ca_file);
      }
    }
    auto r = s->launch(until);
    if (r) return s;
    if (r.error().message().find("address already in use") == std::string::npos)
      return std::move(r).error();
    last_log = r.error().message();
    // A port clash: s's destructor removes the directory; try other ports.
  }
  return make_error(errc::unavailable, "etcd could not bind free ports in 5 attempts; last log:\n",
                    tail(last_log));
}

expected<void> etcd_server::launch(deadline until) {
  // etcd dies with the thread that started it, so a killed test leaves none.
  proc_ = child_process::start(args_, {.output = log_path_});
  if (!proc_.started())
    return make_error(errc::unavailable, "cannot start etcd: ", proc_.start_error());
  while (!until.expired()) {
    if (healthy(metrics_port_)) return {};
    if (proc_.exited()) {
      proc_ = {};
      std::string log = read_file(log_path_);
      if (log.find("address already in use") != std::string::npos)
        return make_error(errc::unavailable,
                          "etcd could not bind its ports (address already in use)");
      return make_error(errc::unavailable, "etcd exited at startup; its log:\n", tail(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return make_error(errc::timeout, "etcd did not become healthy in time; its log:\n",
                    tail(read_file(log_path_)));
}

expected<void> etcd_server::restart(duration timeout) {
  if (running()) return {};
  return launch(deadline::after(timeout));
}

etcd_server* etcd_server::shared() {
  static std::once_flag once;
  static std::unique_ptr<etcd_server> instance;
  std::call_once(once, [] {
    if (!available()) return;
    auto s = start();
    if (!s) throw exception(std::move(s).error());
    instance = std::move(*s);
  });
  return instance.get();
}

etcd_server::~etcd_server() {
  stop();
  if (!data_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(data_dir_, ignored);
  }
}

std::string etcd_server::endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

std::string etcd_server::url() const { return (tls_ ? "https://" : "http://") + endpoint(); }

expected<std::string> etcd_server::etcdctl(const std::vector<std::string>& args) const {
  if (tls_) return make_error(errc::unsupported, "etcd_server::etcdctl speaks plain http only");
  // etcdctl sits next to etcd (Debian's etcd-client).
  auto ctl = std::filesystem::path(binary()).parent_path() / "etcdctl";
  std::string command = "ETCDCTL_API=3 '" + ctl.string() + "' --endpoints=" + endpoint();
  for (const auto& a : args) command += " '" + a + "'";
  command += " 2>&1";
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return make_error(errc::unavailable, "cannot run ", command);
  char buf[512];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  int status = ::pclose(pipe);
  if (status != 0)
    return make_error(errc::unavailable, "etcdctl ", args.empty() ? "" : args.front(),
                      " failed (status ", status, "): ", tail(output));
  return output;
}

void etcd_server::stop() {
  if (!running()) return;
  proc_.signal(SIGTERM);
  proc_.wait(std::chrono::seconds(5));  // SIGKILL after that
  proc_ = {};
}

std::string unique_etcd_prefix(std::string_view name) {
  static std::atomic<int> counter{0};
  return "/troupe-test/" + std::string(name) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "/";
}

}  // namespace troupe::test
