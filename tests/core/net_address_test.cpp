#include <doctest/doctest.h>

#include <algorithm>

#include <troupe/core/net_address.hpp>

using namespace troupe;
using vars = std::map<std::string, std::string>;

namespace {

// A host with a loopback, one private network and a name that resolves to it.
host_facts two_interfaces(std::vector<std::string> name_resolves_to = {"10.9.0.2"}) {
  host_facts f;
  f.interfaces = {{"lo", "127.0.0.1"},
                  {"lo", "::1"},
                  {"eth0", "10.9.0.2"},
                  {"eth0", "fe80::1"},
                  {"ib0", "fe80::2"}};
  f.host_name = "node7";
  f.host_name_addresses = std::move(name_resolves_to);
  return f;
}

// A torchrun-style environment of 4 ranks, `here` of them on this host.
vars ranks(int here) {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", std::to_string(here)},
          {"MASTER_ADDR", "10.9.0.1"},
          {"MASTER_PORT", "29500"}};
}

bool mentions(const error& e, std::string_view text) {
  return e.message().find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("TROUPE_LOCAL_ADDR wins when it is an address of this host") {
  auto v = ranks(2);
  v["TROUPE_LOCAL_ADDR"] = "10.9.0.2";
  v["TROUPE_SOCKET_IFNAME"] = "lo";
  auto a = decide_local_address(v, two_interfaces());
  REQUIRE_MESSAGE(a, a.error().to_string());
  CHECK(*a == "10.9.0.2");
  v["TROUPE_LOCAL_ADDR"] = "127.0.0.1";
  CHECK(decide_local_address(v, two_interfaces()).value() == "127.0.0.1");
}

TEST_CASE("a TROUPE_LOCAL_ADDR that is not assigned on this host is an error naming it") {
  auto v = ranks(2);
  v["TROUPE_LOCAL_ADDR"] = "10.9.0.99";
  auto a = decide_local_address(v, two_interfaces());
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::invalid_argument);
  CHECK(mentions(a.error(), "TROUPE_LOCAL_ADDR='10.9.0.99'"));
  CHECK(mentions(a.error(), "not an address of this host"));
  CHECK(mentions(a.error(), "eth0 (10.9.0.2)"));
  v["TROUPE_LOCAL_ADDR"] = "0.0.0.0";
  a = decide_local_address(v, two_interfaces());
  REQUIRE_FALSE(a);
  CHECK(mentions(a.error(), "not an address other hosts can reach"));
  v["TROUPE_LOCAL_ADDR"] = "no-such-host.invalid";
  a = decide_local_address(v, two_interfaces());
  REQUIRE_FALSE(a);
  CHECK(mentions(a.error(), "TROUPE_LOCAL_ADDR='no-such-host.invalid'"));
}

TEST_CASE("TROUPE_SOCKET_IFNAME picks its interface's first IPv4 address") {
  auto a = decide_local_address(ranks(2), two_interfaces());
  REQUIRE(a);
  auto v = ranks(4);  // even a job on one host follows the interface it is told
  v["TROUPE_SOCKET_IFNAME"] = "eth0";
  CHECK(decide_local_address(v, two_interfaces()).value() == "10.9.0.2");
  v["TROUPE_SOCKET_IFNAME"] = "lo";
  CHECK(decide_local_address(v, two_interfaces()).value() == "127.0.0.1");
}

TEST_CASE(
    "an interface that does not exist, or has no IPv4 address, is an error naming the setting") {
  auto v = ranks(2);
  v["TROUPE_SOCKET_IFNAME"] = "nosuch0";
  auto a = decide_local_address(v, two_interfaces());
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::invalid_argument);
  CHECK(mentions(a.error(), "TROUPE_SOCKET_IFNAME='nosuch0'"));
  CHECK(mentions(a.error(), "no such interface"));
  CHECK(mentions(a.error(), "lo (127.0.0.1), eth0 (10.9.0.2), ib0"));
  v["TROUPE_SOCKET_IFNAME"] = "ib0";
  a = decide_local_address(v, two_interfaces());
  REQUIRE_FALSE(a);
  CHECK(mentions(a.error(), "no IPv4 address"));
}

TEST_CASE("a job whose ranks all run on this host stays on loopback") {
  CHECK(decide_local_address(ranks(4), two_interfaces()).value() == "127.0.0.1");
  vars slurm{{"SLURM_PROCID", "1"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_NNODES", "1"},
             {"SLURM_JOB_ID", "42"},
             {"SLURM_STEP_NODELIST", "localhost"}};
  CHECK(decide_local_address(slurm, two_interfaces()).value() == "127.0.0.1");
  slurm["SLURM_NNODES"] = "2";
  CHECK(decide_local_address(slurm, two_interfaces()).value() == "10.9.0.2");
}

TEST_CASE("a job across hosts uses the address the host name resolves to") {
  CHECK(decide_local_address(ranks(2), two_interfaces({"fe80::1", "10.9.0.2"})).value() ==
        "10.9.0.2");
}

TEST_CASE("a job across hosts whose host name resolves only to loopback is told what to set") {
  for (auto resolved : {std::vector<std::string>{"127.0.1.1"}, std::vector<std::string>{}}) {
    auto a = decide_local_address(ranks(2), two_interfaces(resolved));
    REQUIRE_FALSE(a);
    CHECK(a.error().code() == errc::invalid_argument);
    CHECK(mentions(a.error(), "node7"));
    CHECK(mentions(a.error(), "TROUPE_LOCAL_ADDR"));
    CHECK(mentions(a.error(), "TROUPE_SOCKET_IFNAME"));
    CHECK(mentions(a.error(), "--local-addr"));
  }
}

TEST_CASE("this host's facts hold its loopback interface and a name") {
  auto f = current_host_facts();
  CHECK_FALSE(f.host_name.empty());
  CHECK(std::any_of(f.interfaces.begin(), f.interfaces.end(),
                    [](const interface_address& i) { return i.address == "127.0.0.1"; }));
  CHECK(interface_ipv4(f, "lo", "X").value() == "127.0.0.1");
  CHECK(host_key().starts_with(f.host_name));
}

TEST_CASE("loopback names and addresses are recognized") {
  for (auto h : {"127.0.0.1", "127.0.1.1", "localhost", "::1"}) CHECK(is_loopback_address(h));
  for (auto h : {"10.0.0.1", "0.0.0.0", "node7", "::"}) CHECK_FALSE(is_loopback_address(h));
}

TEST_CASE("a group on one host may use loopback; across hosts a loopback member is refused") {
  std::vector<advertised_address> one_host{{"rank 0", "a ns1", "a", "127.0.0.1"},
                                           {"rank 1", "a ns1", "a", "127.0.0.1"}};
  CHECK(check_reachable(one_host, "group 'world'"));
  std::vector<advertised_address> routable{{"rank 0", "a ns1", "a", "10.0.0.1"},
                                           {"rank 1", "b ns1", "b", "10.0.0.2"}};
  CHECK(check_reachable(routable, "group 'world'"));
  std::vector<advertised_address> mixed{{"rank 0", "a ns1", "a", "10.0.0.1"},
                                        {"rank 1", "b ns1", "b", "127.0.0.1"}};
  auto r = check_reachable(mixed, "group 'world'");
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(mentions(r.error(), "group 'world' spans 2 hosts (a, b)"));
  CHECK(mentions(r.error(), "rank 1 on host b advertises 127.0.0.1"));
  CHECK(mentions(r.error(), "TROUPE_LOCAL_ADDR"));
  // Two network namespaces with the same host name are two hosts.
  std::vector<advertised_address> containers{{"rank 0", "a ns1", "a", "127.0.0.1"},
                                             {"rank 1", "a ns2", "a", "127.0.0.1"}};
  CHECK_FALSE(check_reachable(containers, "group 'world'"));
}

TEST_CASE("a process with no launcher offers its host name's address when that is assigned here") {
  CHECK(decide_local_address({}, two_interfaces()).value() == "10.9.0.2");
  // A name resolving to loopback (Debian's 127.0.1.1), or to an address another host holds
  // (DNS behind NAT), or not at all: loopback.
  CHECK(decide_local_address({}, two_interfaces({"127.0.1.1"})).value() == "127.0.0.1");
  CHECK(decide_local_address({}, two_interfaces({"10.9.0.99"})).value() == "127.0.0.1");
  CHECK(decide_local_address({}, two_interfaces({})).value() == "127.0.0.1");
}

TEST_CASE("local socket names are abstract and differ by service, host and port") {
  const auto store = troupe::local_socket_name("store", "127.0.0.1", 29500);
  CHECK(store == std::string("\0troupe-store/127.0.0.1:29500", 29));
  CHECK(troupe::local_socket_name("rpc", "127.0.0.1", 29500) != store);
  CHECK(troupe::local_socket_name("store", "127.0.0.2", 29500) != store);
  CHECK(troupe::local_socket_name("store", "127.0.0.1", 29501) != store);
}
