// connect_store: opens a store from a URL.
//   tcp://host:port   a tcp_store client of a troupe-store / tcp_store_server
//   memory://         a fresh in-process store
//   memory://name     the in-process store called `name`, shared within this process
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <troupe/core/tls.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

struct store_options {
  /// The default timeout of the store's calls.
  duration timeout = default_timeout();
  /// How long to keep retrying the first connection.
  duration connect_timeout = default_timeout();
  /// Shared secret for tcp://. When empty, job_secret_from_env() is used.
  std::string secret;
  /// Largest frame for tcp://, in bytes.
  std::size_t max_frame_size = std::size_t{64} << 20;
  /// The TLS identity for tcp:// over TCP. When empty, tls_config_from_env() is used.
  tls::config tls;
};

/// The job's secret from the environment: TROUPE_JOB_SECRET, else TROUPE_STORE_SECRET (its
/// older name, still read), else empty. Empty values count as unset.
std::string job_secret_from_env();

/// The job's TLS files from the environment (TROUPE_TLS_CERT, TROUPE_TLS_KEY,
/// TROUPE_TLS_CA); empty fields where unset. TLS is on when any is set (then all must be).
tls::config tls_config_from_env();

/// A fresh random job secret: 32 bytes from the kernel's random source (getrandom), as 64
/// hex digits. errc::unavailable if the kernel has no randomness to give.
expected<std::string> make_job_secret();

/// The secret kept in the file at `path` (surrounding whitespace trimmed). Errors name the
/// path: a file that cannot be read, or is empty, is errc::invalid_argument.
expected<std::string> read_secret_file(const std::string& path);

/// The scheme of a store URL ("tcp", "memory", ...), or invalid_argument.
expected<std::string> store_url_scheme(std::string_view url);

/// Splits "host:port" (or "[v6]:port"); invalid_argument quoting the text otherwise.
expected<std::pair<std::string, std::uint16_t>> parse_host_port(std::string_view text);

/// Opens the store that `url` names; an unknown scheme is invalid_argument listing the
/// known ones.
expected<std::unique_ptr<store>> connect_store(std::string_view url,
                                               const store_options& options = {});

}  // namespace troupe
