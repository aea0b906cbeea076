// net_address: the address this process offers to the other processes of its job. Every
// component that listens for peers (the RPC agent, the gloo device, the store that rank 0
// hosts) binds and advertises it, so that a job spanning hosts works by default and a job
// on one host stays on loopback. docs/multi-node.md explains the choice for users.
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe {

/// Whether `host` is a loopback name or address: "localhost", 127.0.0.0/8 or ::1.
bool is_loopback_address(std::string_view host) noexcept;

/// The abstract-namespace name (leading NUL byte included) of the local (Unix domain)
/// socket that a `service` ("store", "rpc") listening on loopback `host`:`port` opens
/// beside its TCP listener: "\0troupe-<service>/<host>:<port>". Abstract names belong to
/// the network namespace, so they reach only the processes that share its loopback.
std::string local_socket_name(std::string_view service, std::string_view host, std::uint16_t port);

/// One address assigned to one interface of this host.
struct interface_address {
  /// The interface's name, e.g. "eth0".
  std::string interface;
  /// The address, as text ("10.0.0.2", "fe80::1").
  std::string address;
};

/// The IPv4 and IPv6 addresses assigned to this host's interfaces (getifaddrs), loopback
/// included, in the kernel's order.
std::vector<interface_address> host_interface_addresses();

/// This host's name (gethostname), "localhost" when it cannot be read.
std::string host_name();

/// A key that differs between hosts that cannot reach each other's loopback: the host
/// name and the network namespace (two containers with their own network on one machine
/// count as two hosts).
std::string host_key();

/// The facts about this host that decide its address; gathered by
/// current_host_facts(), filled by hand in tests.
struct host_facts {
  /// host_interface_addresses().
  std::vector<interface_address> interfaces;
  /// host_name().
  std::string host_name;
  /// The addresses host_name resolves to (IPv4 first); empty when it does not resolve.
  std::vector<std::string> host_name_addresses;
};
host_facts current_host_facts();

/// The first IPv4 address of interface `ifname` in `facts`. errc::not_found names
/// `setting` and lists this host's interfaces when there is no such interface or it has
/// no IPv4 address.
expected<std::string> interface_ipv4(const host_facts& facts, std::string_view ifname,
                                     std::string_view setting);

/// `value` (an IP address, or a host name resolved here) when it is assigned on this host
/// (loopback counts), as an IP address; else errc::invalid_argument naming `setting` and
/// listing this host's interfaces. 0.0.0.0 and :: are refused (nothing can reach them).
expected<std::string> check_local_address(const host_facts& facts, const std::string& value,
                                          std::string_view setting);

/// This process's address as the other processes of its job should reach it, decided
/// from the environment `vars`:
///  1. TROUPE_LOCAL_ADDR (troupe-run exports its node's address); an IP address or a host
///     name whose address is assigned on this host (loopback counts);
///  2. else the first IPv4 address of the interface TROUPE_SOCKET_IFNAME names;
///  3. else 127.0.0.1 when every rank of the job runs on this host (LOCAL_WORLD_SIZE
///     equals WORLD_SIZE, or SLURM's equivalents);
///  4. else the address this host's name resolves to, when that is not loopback;
///  5. with no launcher's variables at all (a dynamic group joined by store URL), the host
///     name's IPv4 address when it is not loopback and is assigned on this host, else
///     127.0.0.1.
/// Otherwise errc::invalid_argument naming TROUPE_LOCAL_ADDR, TROUPE_SOCKET_IFNAME and
/// troupe-run's --local-addr. A TROUPE_LOCAL_ADDR that is not this host's, and a
/// TROUPE_SOCKET_IFNAME that names no interface, are errors too (never a fallback).
expected<std::string> decide_local_address(const std::map<std::string, std::string>& vars,
                                           const host_facts& facts);

/// decide_local_address() for this process's environment and this host.
expected<std::string> local_address();

/// What one member of a group advertises, for check_reachable().
struct advertised_address {
  /// How messages name the member, e.g. "worker 'worker3'" or "rank 3".
  std::string who;
  /// host_key() of the member's host.
  std::string host_key;
  /// The member's host name, for messages.
  std::string host_name;
  /// The address the member listens on.
  std::string address;
};

/// Refuses a group whose members run on more than one host while one of them advertises
/// a loopback address (the others could never reach it): errc::invalid_argument naming
/// the member, its host and the variables that fix it. `group` names the group in the
/// message. Every member runs the same check on the same records and gets the same error.
expected<void> check_reachable(std::span<const advertised_address> members, std::string_view group);

}  // namespace troupe
