// troupe-store: runs a standalone TCP store server until SIGINT or SIGTERM.
//   troupe-store --host 127.0.0.1 --port 29500 --secret-file /run/secrets/store
// With TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA set, TCP clients must speak TLS.
// Prints "listening on HOST:PORT" once it accepts connections. Exit codes as troupe-run's:
// 0 after a clean shutdown, 1 on a failure, 2 for bad usage.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <troupe/core/log.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace {

int fail(const std::string& message) {
  std::cerr << "troupe-store: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs a troupe TCP store server that workers reach as tcp://HOST:PORT."};
  troupe::tcp_store_server_options options;
  std::string secret_file;
  std::size_t max_frame_bytes = options.max_frame_size;
  app.add_option("--host", options.host, "Address to listen on; 0.0.0.0 listens on every interface")
      ->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--secret-file", secret_file,
                 "File holding the shared secret clients must present (else "
                 "TROUPE_JOB_SECRET or its alias TROUPE_STORE_SECRET, else none)")
      ->check(CLI::ExistingFile);
  app.add_option("--max-frame-size", max_frame_bytes, "Largest frame accepted, in bytes")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{64}, std::size_t{1} << 31));
  app.add_option("--io-threads", options.io_threads,
                 "Event loops serving the connections; 0: one per hardware thread, at most 4")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{64}));
  // The exit codes of troupe-run: 0 done, 1 failure, 2 bad usage (not CLI11's own codes).
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "troupe-store: " << e.what() << "\nRun with --help for the flags.\n";
    return 2;
  }
  options.max_frame_size = max_frame_bytes;

  if (!secret_file.empty()) {
    std::ifstream in(secret_file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return fail("cannot read the secret file '" + secret_file + "'");
    options.secret = ss.str();
    while (!options.secret.empty() &&
           (options.secret.back() == '\n' || options.secret.back() == '\r'))
      options.secret.pop_back();
    if (options.secret.empty()) return fail("the secret file '" + secret_file + "' is empty");
  } else {
    options.secret = troupe::job_secret_from_env();
  }
  // Mutual TLS on TCP connections when TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA
  // are set (docs/security.md).
  options.tls = troupe::tls_config_from_env();

  // Block the signals before any thread starts, so that only sigwait below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = troupe::tcp_store_server::start(options);
  if (!server) return fail(server.error().message());
  std::cout << "listening on " << (*server)->host() << ":" << (*server)->port() << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  TROUPE_LOG(troupe::log_level::info, "store", "troupe-store: signal ", sig, ", shutting down");
  (*server)->shutdown(std::chrono::seconds(5));
  return 0;
}
