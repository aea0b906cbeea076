#include <troupe/collectives/gloo/member_addresses.hpp>

#include <troupe/collectives/settings.hpp>
#include <troupe/core/codec.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::collectives {

expected<std::string> choose_address(store& setup, const process_group& g,
                                     std::vector<gloo_hier::member_choice>& choices) {
  std::string host;
  if (auto h = settings::gloo_host.value()) {
    host = *h;
  } else if (auto here = local_address()) {
    host = *here;
  } else {
    return make_error(here.error().code(), "connecting the members of ", describe(g),
                      ": cannot choose this member's address: ", here.error().message(),
                      " (TROUPE_GLOO_HOST sets gloo's alone)");
  }
  if (g.size() == 1) return host;
  bytes mine;
  byte_writer w(mine);
  const auto real_key = host_key();
  const auto choice = gloo_hier::choice_from_env(real_key);
  w.str(real_key);
  w.str(host_name());
  w.str(host);
  w.str(choice.key);
  w.u8(choice.enabled ? 1 : 0);
  w.u64(choice.min_bytes);
  auto all = all_gather(setup, "hosts", g.rank(), g.size(), mine, g.spec().timeout);
  if (!all)
    return make_error(all.error().code(), "connecting the members of ", describe(g),
                      ": exchanging addresses: ", all.error().message());
  std::vector<advertised_address> members;
  for (int r = 0; r < g.size(); ++r) {
    byte_reader rd((*all)[static_cast<std::size_t>(r)]);
    auto key = rd.str("host key");
    auto name = rd.str("host name");
    auto address = rd.str("address");
    auto claimed = rd.str("claimed host key");
    auto enabled = rd.u8("hierarchical");
    auto min_bytes = rd.u64("hierarchical threshold");
    if (!key || !name || !address || !claimed || !enabled || !min_bytes)
      return make_error(errc::protocol_error, describe(g), ": rank ", r,
                        " published a malformed address record");
    members.push_back({strcat("rank ", r), *key, *name, *address});
    choices.push_back({*claimed, *enabled != 0, *min_bytes});
  }
  auto reachable = check_reachable(members, describe(g));
  if (!reachable) return std::move(reachable).error();
  return host;
}

}  // namespace troupe::collectives
