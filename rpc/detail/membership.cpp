// agent_core: forming the group (static and dynamic) and changing it (join, leave).
#include <random>

#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/rpc/detail/agent_core.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/membership_token.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::rpc::detail {

namespace {

constexpr std::uint8_t op_join = 1;
constexpr std::uint8_t op_leave = 2;

std::string random_token() {
  std::random_device rd;
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) out += hex[rd() % 16];
  return out;
}

// The check every member runs on the same records: no loopback address in a group whose
// members run on more than one host.
expected<void> check_addresses(const std::vector<const member*>& members,
                               const std::string& group) {
  std::vector<advertised_address> v;
  for (const auto* m : members)
    v.push_back({strcat("worker '", m->info.name, "'"), m->host_key, m->host_name, m->host});
  return check_reachable(v, strcat("the RPC group '", group, "'"));
}

}  // namespace

bytes encode_member(const member& m) {
  bytes out;
  (void)serialize(out, nullptr, m.info, m.host, m.port, encode(m.devices), m.host_key, m.host_name,
                  m.tag);
  return out;
}

expected<member> decode_member(std::span<const std::byte> data) {
  member m;
  bytes dev;
  TROUPE_TRY(
      deserialize(data, nullptr, m.info, m.host, m.port, dev, m.host_key, m.host_name, m.tag));
  auto d = decode_worker_device_info(dev);
  if (!d) return std::move(d).error();
  m.devices = std::move(*d);
  return m;
}

member agent_core::my_record() const {
  return member{self_,
                transport_->host(),
                transport_->port(),
                worker_device_info{name_, device_count_, opts_.device_maps, opts_.devices},
                host_key(),
                host_name(),
                opts_.membership_tag};
}

expected<void> agent_core::ensure_token(deadline d) {
  if (!opts_.job_token.empty()) {
    token_ = opts_.job_token;
    return ok();
  }
  // The job's secret, when it has one, is the token: nothing that grants access is kept in
  // the store.
  if (auto secret = job_secret_from_env(); !secret.empty()) {
    token_ = std::move(secret);
    return ok();
  }
  auto mine = to_bytes(random_token());
  auto v =
      store_->compare_set(strcat(opts_.group, "/job_token"), std::nullopt, mine, d.remaining());
  if (!v) return std::move(v).error();
  token_ = troupe::to_string(std::span<const std::byte>(*v));
  return ok();
}

expected<void> agent_core::warm_up(deadline d) {
  std::vector<future<wire::frame>> pings;
  for (const auto& w : workers()) {
    auto fb = begin_request(ping_function, 0, 0, d.remaining());
    pings.push_back(send_request(w, std::move(fb), d.remaining()));
  }
  auto all = when_all(std::move(pings)).get(d.remaining() + std::chrono::milliseconds(100));
  if (!all) return std::move(all).error();
  return ok();
}

expected<void> agent_core::init_static(deadline d) {
  auto gathered = all_gather(*store_, strcat(opts_.group, "/static"), rank_, *world_size_,
                             encode_member(my_record()), d.remaining());
  if (!gathered) return std::move(gathered).error();
  std::vector<worker_device_info> infos;
  std::map<std::string, member> all;
  for (std::size_t r = 0; r < gathered->size(); ++r) {
    auto m = decode_member((*gathered)[r]);
    if (!m) return std::move(m).error();
    if (m->info.id != static_cast<int>(r))
      return make_error(errc::protocol_error, "rank ", r, " published the record of id ",
                        m->info.id);
    infos.push_back(m->devices);
    all.emplace(m->info.name, std::move(*m));
  }
  std::vector<const member*> members;
  for (const auto& [n, m] : all) members.push_back(&m);
  TROUPE_TRY(check_addresses(members, opts_.group));
  // The same check on the same records in the same order: every worker fails with the
  // same first error, naming the culprit, before anything else starts.
  auto checked = resolve_device_setup(name_, infos, group_kind::static_group);
  if (!checked) return std::move(checked).error();
  TROUPE_TRY(members_.replace(std::move(all)));
  TROUPE_TRY(warm_up(d));
  if (trace::enabled()) {
    // Rank 0 is the trace's clock reference: every other rank measures against it.
    if (rank_ == 0) {
      trace::set_clock(0, 0, "reference (rank 0)");
    } else {
      for (const auto& w : workers())
        if (w.id == 0) {
          if (auto r = record_clock_offset(w, 16, d); !r)
            TROUPE_LOG(log_level::warn, "trace",
                       "no clock offset against rank 0: ", r.error().message());
        }
    }
  }
  return barrier(*store_, strcat(opts_.group, "/ready"), rank_, *world_size_, d.remaining());
}

expected<void> agent_core::record_clock_offset(const worker_info& to, int samples, deadline d) {
  std::int64_t best_rtt = -1, best_offset = 0;
  for (int i = 0; i < samples; ++i) {
    auto fb = begin_request(ping_function, 0, 0, d.remaining());
    const auto t0 = trace::now_ns();
    auto reply = send_request(to, std::move(fb), d.remaining()).get(d.remaining());
    const auto t1 = trace::now_ns();
    if (!reply) return std::move(reply).error();
    std::int64_t theirs = 0;
    if (auto r = deserialize(reply->message, nullptr, theirs); !r)
      return make_error(errc::protocol_error, "worker '", to.name,
                        "' answered a ping without its clock");
    if (best_rtt < 0 || t1 - t0 < best_rtt) {
      best_rtt = t1 - t0;
      best_offset = t0 + (t1 - t0) / 2 - theirs;
    }
  }
  trace::set_clock(best_offset, best_rtt / 2,
                   strcat("rpc ping to '", to.name, "', best of ", samples));
  return ok();
}

expected<void> agent_core::announce(const member& who, std::uint8_t op,
                                    const std::vector<member>& to, deadline d) {
  std::vector<future<wire::frame>> acks;
  auto rec = encode_member(who);
  for (const auto& m : to) {
    auto c = connection_to(m, d);
    if (!c) return std::move(c).error();
    wire::frame_builder fb(wire::kind::membership, next_call_.fetch_add(1));
    (void)serialize(fb.message(), nullptr, op, rec);
    TROUPE_TRY(fb.finish());
    auto id = fb.id();
    promise<wire::frame> p;
    acks.push_back(p.get_future());
    TROUPE_TRY((*c)->add_pending(id, std::move(p), d));
    if (auto s = (*c)->send(std::move(fb)); !s) (*c)->complete(id, std::move(s).error());
  }
  auto all = when_all(std::move(acks)).get(d.remaining() + std::chrono::milliseconds(100));
  if (!all) return std::move(all).error();
  return ok();
}

expected<void> agent_core::init_dynamic(deadline d) {
  membership_token_options mo;
  mo.op_timeout = std::max(d.remaining(), duration(1));
  auto guard = acquire_membership_token(*store_, strcat(opts_.group, "/membership"), name_,
                                        d.remaining(), mo);
  if (!guard) return std::move(guard).error();
  std::string members_key = strcat(opts_.group, "/members");
  std::vector<std::string> names;
  std::array<std::string, 1> keys{members_key};
  auto present = store_->check(keys, d.remaining());
  if (!present) return std::move(present).error();
  if (*present) {
    auto v = store_->get(members_key, d.remaining());
    if (!v) return std::move(v).error();
    TROUPE_TRY(deserialize(*v, nullptr, names));
  }
  std::vector<member> listed;
  for (const auto& n : names) {
    auto rec = store_->get(strcat(opts_.group, "/worker/", n), d.remaining());
    if (!rec) return std::move(rec).error();
    auto m = decode_member(*rec);
    if (!m) return std::move(m).error();
    listed.push_back(std::move(*m));
  }
  // Before dialing: a loopback address on another host would reach the wrong process.
  {
    auto me = my_record();
    std::vector<const member*> members{&me};
    for (const auto& m : listed) members.push_back(&m);
    TROUPE_TRY(check_addresses(members, opts_.group));
  }
  std::vector<member> alive;
  std::vector<std::string> dead;
  for (auto& listed_member : listed) {
    auto* m = &listed_member;
    const std::string& n = m->info.name;
    auto c = dial(*m, d);
    if (!c) {
      if (c.error().code() != errc::connection_lost) return std::move(c).error();
      TROUPE_LOG(log_level::warn, "rpc", "worker '", n, "' is listed but unreachable (",
                 c.error().message(), "); removing it from the group");
      dead.push_back(n);
      continue;
    }
    if (n == name_) {
      (*c)->close(make_error(errc::shut_down, "name check done"));
      return make_error(errc::already_exists, "a worker named '", name_,
                        "' is already in the group; choose another name, or wait until it leaves");
    }
    transport_->keep_opened(n, *c);
    alive.push_back(std::move(*m));
  }
  auto id = store_->add(strcat(opts_.group, "/next_id"), 1, d.remaining());
  if (!id) return std::move(id).error();
  self_.id = static_cast<std::int32_t>(*id - 1);
  auto me = my_record();
  std::map<std::string, member> all;
  std::vector<worker_device_info> infos;
  for (const auto& m : alive) {
    infos.push_back(m.devices);
    all.emplace(m.info.name, m);
  }
  infos.push_back(me.devices);
  all.emplace(name_, me);
  auto checked = resolve_device_setup(name_, infos, group_kind::dynamic_group);
  if (!checked) return std::move(checked).error();
  if (auto told = announce(me, op_join, alive, d); !told) {
    (void)announce(me, op_leave, alive, deadline::after(std::chrono::seconds(2)));
    return std::move(told).error();
  }
  TROUPE_TRY(members_.replace(std::move(all)));
  for (const auto& n : dead) (void)store_->erase(strcat(opts_.group, "/worker/", n), d.remaining());
  TROUPE_TRY(store_->set(strcat(opts_.group, "/worker/", name_), encode_member(me), d.remaining()));
  std::vector<std::string> now;
  for (const auto& m : alive) now.push_back(m.info.name);
  now.push_back(name_);
  bytes list;
  (void)serialize(list, nullptr, now);
  TROUPE_TRY(store_->set(members_key, list, d.remaining()));
  TROUPE_TRY(guard->release());
  return warm_up(d);
}

void agent_core::handle_membership(const std::shared_ptr<connection>& c, wire::frame&& f) {
  std::uint8_t op = 0;
  bytes rec;
  auto id = f.id;
  if (auto r = deserialize(f.message, nullptr, op, rec); !r) return reply_error(c, id, r.error());
  auto m = decode_member(rec);
  if (!m) return reply_error(c, id, m.error());
  if (op != op_join && op != op_leave)
    return reply_error(c, id,
                       make_error(errc::protocol_error, "unknown membership operation ", int(op)));
  auto all = members_.all();
  std::shared_ptr<connection> stale;
  // A leaver the job's membership already took out (expel) was announced then.
  const bool known = all.count(m->info.name) > 0;
  if (op == op_join) {
    all[m->info.name] = *m;
  } else {
    all.erase(m->info.name);
  }
  // A new worker under a reused name, or a leaver: forget the old connection.
  stale = transport_->take_opened(m->info.name);
  if (stale) {
    stale->mark_peer_leaving();
    stale->close(make_error(errc::peer_left, "worker '", m->info.name, "' left the group")
                     .with_worker(m->info.name));
  }
  if (auto r = members_.replace(std::move(all)); !r)
    return reply_error(c, id, r.error().with_worker(name_));
  TROUPE_LOG(log_level::info, "rpc", "worker '", m->info.name, "' ",
             op == op_join ? "joined" : "left");
  if (op == op_leave && m->info.name != name_) drop_rref_shares_of(m->info.name);
  if (m->info.name != name_ && (op == op_join || known))
    notify_membership(
        {op == op_join ? membership_change::joined : membership_change::left, m->info, {}});
  wire::frame_builder ack(wire::kind::response, id);
  if (ack.finish()) (void)c->send(std::move(ack));
  // Connect to a newcomer now, so that its death is noticed even before the first call.
  if (op == op_join && m->info.name != name_)
    (void)connection_to(*m, deadline::after(std::chrono::seconds(5)));
}

bool agent_core::expel(const std::string& name, std::string_view tag, const error& why) {
  if (!dynamic() || name == name_) return false;
  auto gone_member = members_.remove(name, tag);
  if (!gone_member) return false;
  const worker_info info = gone_member->info;
  auto gone = transport_->take_opened(name);
  // Calls still waiting on it fail with the membership's reason.
  if (gone) gone->close(why);
  drop_rref_shares_of(name);
  TROUPE_LOG(log_level::info, "rpc", "worker '", name, "' is out of the group: ", why.message());
  notify_membership({membership_change::failed, info, why});
  return true;
}

expected<void> agent_core::leave(duration timeout) {
  if (!dynamic())
    return make_error(errc::unsupported,
                      "leave() is for dynamic groups (initialized without a "
                      "world size); a static group ends with shutdown()");
  {
    std::lock_guard<std::mutex> lk(lifecycle_mu_);
    if (stopped_) return ok();
  }
  leaving_.store(true);
  auto d = deadline::after(timeout);
  TROUPE_LOG(log_level::info, "rpc", "worker '", name_, "' leaving");
  expected<void> result = wait_outstanding(d);
  TROUPE_LOG(log_level::info, "rpc", "worker '", name_, "' outstanding calls done");
  membership_token_options mo;
  mo.op_timeout = std::max(d.remaining(), duration(1));
  auto guard = acquire_membership_token(*store_, strcat(opts_.group, "/membership"), name_,
                                        d.remaining(), mo);
  if (guard) {
    const auto others = members_.others();
    auto told = announce(my_record(), op_leave, others, d);
    if (!told && result) result = std::move(told).error();
    std::string members_key = strcat(opts_.group, "/members");
    if (auto v = store_->get(members_key, d.remaining())) {
      std::vector<std::string> names;
      if (deserialize(*v, nullptr, names)) {
        std::erase(names, name_);
        bytes list;
        (void)serialize(list, nullptr, names);
        (void)store_->set(members_key, list, d.remaining());
      }
    }
    (void)store_->erase(strcat(opts_.group, "/worker/", name_), d.remaining());
    (void)guard->release();
  } else if (result) {
    result = std::move(guard).error();
  }
  send_shutdown_notices();
  stop_local(make_error(errc::peer_left, "worker '", name_, "' left the group").with_worker(name_));
  TROUPE_LOG(log_level::info, "rpc", "worker '", name_,
             "' left: ", result ? "ok" : result.error().to_string());
  return result;
}

std::uint64_t agent_core::add_membership_listener(membership_listener l) {
  std::lock_guard<std::mutex> lk(listeners_mu_);
  auto id = next_listener_++;
  listeners_.emplace(id, std::move(l));
  return id;
}

void agent_core::remove_membership_listener(std::uint64_t id) {
  std::lock_guard<std::mutex> lk(listeners_mu_);
  listeners_.erase(id);
}

void agent_core::notify_membership(const membership_event& e) {
  std::vector<membership_listener> ls;
  {
    std::lock_guard<std::mutex> lk(listeners_mu_);
    for (auto& [id, l] : listeners_) ls.push_back(l);
  }
  for (auto& l : ls) l(e);
}

}  // namespace troupe::rpc::detail
