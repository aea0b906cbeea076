#include <troupe/launcher/node_rendezvous.hpp>

#include <algorithm>
#include <charconv>
#include <numeric>
#include <thread>

#include <troupe/core/log.hpp>

namespace troupe::launcher {

namespace {

bool parse_long(std::string_view s, long& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

}  // namespace

std::string encode_node_info(const node_info& n) {
  return strcat(n.nproc, '\n', n.node_rank, '\n', n.free_port, '\n', n.addr, '\n', n.id);
}

expected<node_info> decode_node_info(std::string_view text) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (int i = 0; i < 4; ++i) {
    auto nl = text.find('\n', start);
    if (nl == std::string_view::npos)
      return make_error(errc::protocol_error, "malformed node record '", text, "'");
    parts.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  parts.push_back(text.substr(start));
  node_info n;
  long nproc = 0;
  long rank = 0;
  long port = 0;
  if (!parse_long(parts[0], nproc) || !parse_long(parts[1], rank) || !parse_long(parts[2], port) ||
      nproc < 1)
    return make_error(errc::protocol_error, "malformed node record '", text, "'");
  n.nproc = static_cast<int>(nproc);
  n.node_rank = static_cast<int>(rank);
  n.free_port = static_cast<int>(port);
  n.addr = std::string(parts[3]);
  n.id = std::string(parts[4]);
  return n;
}

node_rendezvous::node_rendezvous(store& job_store, rendezvous_settings settings)
    : store_(job_store), settings_(settings) {}

std::string node_rendezvous::key(long round, std::string_view name) const {
  return strcat("round/", round, '/', name);
}

expected<std::int64_t> node_rendezvous::counter(long round, std::string_view name,
                                                std::int64_t delta) {
  return store_.add(key(round, name), delta, watch_timeout());
}

duration node_rendezvous::watch_timeout() const {
  if (!watch_until_) return settings_.op_timeout;
  // At least a millisecond: a call with no time left fails at once with errc::timeout.
  return std::max<duration>(watch_until_->remaining(), std::chrono::milliseconds(1));
}

expected<long> node_rendezvous::read_current_round() {
  std::string k = "current_round";
  auto present = store_.check(std::span(&k, 1), settings_.op_timeout);
  if (!present) return std::move(present).error();
  if (!*present) return 0L;
  auto v = store_.get_string(k, settings_.op_timeout);
  if (!v) return std::move(v).error();
  long r = 0;
  if (!parse_long(*v, r))
    return make_error(errc::protocol_error, "the key current_round holds '", *v,
                      "', not a round number");
  return r;
}

expected<void> node_rendezvous::advance_current_round(long to) {
  for (;;) {
    std::string k = "current_round";
    auto present = store_.check(std::span(&k, 1), settings_.op_timeout);
    if (!present) return std::move(present).error();
    std::optional<bytes> seen;
    if (*present) {
      auto v = store_.get(k, settings_.op_timeout);
      if (!v) return std::move(v).error();
      long r = 0;
      if (!parse_long(troupe::to_string(*v), r))
        return make_error(errc::protocol_error, "current_round holds '", troupe::to_string(*v),
                          "'");
      if (r >= to) return ok();
      seen = std::move(*v);
    }
    bytes want = to_bytes(std::to_string(to));
    auto after = store_.compare_set(k, seen, want, settings_.op_timeout);
    if (!after) return std::move(after).error();
    if (*after == want) return ok();
  }
}

expected<void> node_rendezvous::join(const node_info& me) {
  me_ = me;
  if (last_round_ >= 0) TROUPE_TRY(request_reform());
  auto current = read_current_round();
  if (!current) return std::move(current).error();
  long r = std::max(*current, last_round_ + 1);
  TROUPE_TRY(advance_current_round(r));
  auto n = counter(r, "joined", 1);
  if (!n) return std::move(n).error();
  slot_ = static_cast<int>(*n - 1);
  joining_ = r;
  TROUPE_TRY(store_.set(key(r, strcat("node/", slot_)), encode_node_info(me)));
  if (!deadline_) deadline_ = deadline::after(settings_.join_timeout);
  TROUPE_LOG(log_level::info, "rendezvous", me.id, " joined round ", r, " as slot ", slot_);
  return ok();
}

expected<round_result> node_rendezvous::await_round(const std::function<bool()>& cancelled) {
  if (joining_ < 0)
    return make_error(errc::internal, "node_rendezvous::await_round called before join");
  // When this node first saw MIN nodes in the round (time_point{} until then).
  clock::time_point min_reached{};
  for (;;) {
    const long r = joining_;
    if (cancelled && cancelled())
      return make_error(errc::aborted, "rendezvous round ", r, " cancelled by a signal");
    // Has someone closed the round?
    std::string closed_key = key(r, "closed");
    auto closed_present = store_.check(std::span(&closed_key, 1), settings_.op_timeout);
    if (!closed_present) return std::move(closed_present).error();
    if (*closed_present) {
      auto v = store_.get_string(closed_key, settings_.op_timeout);
      if (!v) return std::move(v).error();
      long count = 0;
      if (!parse_long(*v, count) || count < 1)
        return make_error(errc::protocol_error, closed_key, " holds '", *v, "'");
      if (slot_ >= count) {
        if (settings_.open_rounds) {
          // Open rounds: enter the running round, unless it re-forms or finished.
          auto late = admit_late(r, count, cancelled);
          if (!late) return std::move(late).error();
          if (*late) return std::move(**late);
        }
        // Too late for this round: say so and wait in the next one.
        TROUPE_TRY(counter(r, "waiting", 1));
        if (count >= settings_.max_nodes) {
          TROUPE_LOG(log_level::info, "rendezvous", "round ", r, " is full (", count,
                     " nodes); waiting as a standby");
          for (;;) {
            auto restart = counter(r, "restart", 0);
            if (!restart) return std::move(restart).error();
            if (*restart > 0) break;
            if (cancelled && cancelled())
              return make_error(errc::aborted, "rendezvous cancelled by a signal");
            if (deadline_->expired())
              return make_error(errc::timeout, "round ", r, " stayed full with ", count,
                                " nodes for ", format_duration(settings_.join_timeout),
                                "; this node never got in");
            std::this_thread::sleep_for(settings_.poll_interval);
          }
        }
        auto next = r + 1;
        TROUPE_TRY(advance_current_round(next));
        auto n = counter(next, "joined", 1);
        if (!n) return std::move(n).error();
        slot_ = static_cast<int>(*n - 1);
        joining_ = next;
        TROUPE_TRY(store_.set(key(next, strcat("node/", slot_)), encode_node_info(me_)));
        min_reached = {};
        continue;
      }
      // Admitted: read everyone's record.
      auto nodes = read_round_nodes(r, count);
      if (!nodes) return std::move(nodes).error();
      auto out = settle(r, count, std::move(*nodes));
      TROUPE_LOG(log_level::info, "rendezvous", "round ", r, " closed with ", count,
                 " nodes; this node is group rank ", out.group_rank);
      return out;
    }
    // Not closed yet: close it when it is full, or when MIN are in and last call is over.
    auto joined = counter(r, "joined", 0);
    if (!joined) return std::move(joined).error();
    const auto now = clock::now();
    std::optional<long> close_at;
    if (*joined >= settings_.max_nodes) {
      close_at = settings_.max_nodes;
    } else if (*joined >= settings_.min_nodes) {
      if (min_reached == clock::time_point{}) min_reached = now;
      if (now - min_reached >= settings_.last_call) close_at = static_cast<long>(*joined);
    } else if (deadline_->expired()) {
      return make_error(errc::timeout, "rendezvous round ", r, " timed out after ",
                        format_duration(settings_.join_timeout), ": ", *joined, " of at least ",
                        settings_.min_nodes,
                        " nodes joined; start the missing nodes or lower MIN in --nnodes");
    }
    if (close_at) {
      auto want = to_bytes(std::to_string(*close_at));
      auto res = store_.compare_set(closed_key, std::nullopt, want, settings_.op_timeout);
      if (!res) return std::move(res).error();
      continue;
    }
    // Sleep until the round closes or the next look at the counter is due.
    duration wait = settings_.poll_interval;
    if (min_reached != clock::time_point{}) {
      auto left = std::chrono::duration_cast<duration>(min_reached + settings_.last_call - now);
      wait = std::max(duration(1), std::min(wait, left));
    }
    auto got = store_.get(closed_key, wait);
    if (!got && got.error().code() != errc::timeout) return std::move(got).error();
  }
}

expected<round_result> node_rendezvous::next_round(const node_info& me,
                                                   const std::function<bool()>& cancelled) {
  TROUPE_TRY(join(me));
  return await_round(cancelled);
}

expected<std::vector<node_info>> node_rendezvous::read_round_nodes(long r, long count) {
  std::vector<std::string> keys;
  for (long i = 0; i < count; ++i) keys.push_back(key(r, strcat("node/", i)));
  TROUPE_TRY(store_.wait(keys, settings_.op_timeout));
  std::vector<node_info> nodes;
  for (const auto& k : keys) {
    auto text = store_.get_string(k, settings_.op_timeout);
    if (!text) return std::move(text).error();
    auto n = decode_node_info(*text);
    if (!n) return std::move(n).error();
    nodes.push_back(std::move(*n));
  }
  return nodes;
}

// Orders the `count` nodes of closed round `r` (hints, then arrival) and makes this node a
// member of it; a late node (slot_ >= count) finds its place in admit_late().
round_result node_rendezvous::settle(long r, long count, std::vector<node_info> nodes) {
  std::vector<int> order(nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    auto hint = [&](int i) { return nodes[i].node_rank < 0 ? 1 << 30 : nodes[i].node_rank; };
    return hint(a) < hint(b);
  });
  round_result out;
  out.round = r;
  int base = 0;
  for (std::size_t g = 0; g < order.size(); ++g) {
    const auto& n = nodes[order[g]];
    if (order[g] == slot_) {
      out.group_rank = static_cast<int>(g);
      out.rank_base = base;
    }
    base += n.nproc;
    out.nodes.push_back(n);
  }
  out.world_size = base;
  last_round_ = r;
  last_num_nodes_ = static_cast<int>(count);
  group_rank_ = out.group_rank;
  peers_.clear();
  for (std::size_t g = 0; g < out.nodes.size(); ++g)
    if (static_cast<int>(g) != group_rank_ || slot_ >= count)
      peers_.push_back({static_cast<int>(g), out.nodes[g].id, std::string(), clock::now(), false,
                        out.nodes[g].nproc});
  own_nproc_ = me_.nproc;
  next_beat_ = clock::time_point{};
  reform_requested_ = false;
  left_ = false;
  followed_ = true;
  next_scan_ = clock::time_point{};
  joining_ = -1;
  deadline_.reset();
  return out;
}

expected<bool> node_rendezvous::check_heartbeats() {
  if (settings_.heartbeat_timeout <= duration::zero()) return false;
  const auto now = clock::now();
  if (now < next_beat_) return false;
  next_beat_ = now + settings_.heartbeat_timeout / 4;
  const duration t = watch_timeout();
  TROUPE_TRY(store_.set(key(last_round_, strcat("alive/", group_rank_)),
                        to_bytes(std::to_string(++beats_)), t));
  for (auto& p : peers_) {
    if (p.gone) continue;
    std::string k = key(last_round_, strcat("alive/", p.group_rank));
    auto present = store_.check(std::span(&k, 1), t);
    if (!present) return std::move(present).error();
    std::string value;
    if (*present) {
      auto v = store_.get_string(k, t);
      if (!v) return std::move(v).error();
      value = std::move(*v);
    }
    if (value != p.seen_beat) {
      p.seen_beat = std::move(value);
      p.seen_at = now;
      continue;
    }
    if (now - p.seen_at <= settings_.heartbeat_timeout) continue;
    if (settings_.open_rounds) {
      // Let it go: the first node to notice marks it gone; the others read that.
      auto why = mark_gone(p.group_rank,
                           strcat("silent for ", format_duration(settings_.heartbeat_timeout),
                                  " (heartbeat_timeout), seen by ", me_.id));
      if (!why) return std::move(why).error();
      p.gone = true;
      news_.push_back(strcat("node ", p.id, " (group rank ", p.group_rank, ") left round ",
                             last_round_, ": ", *why, "; the other nodes' workers run on"));
      continue;
    }
    TROUPE_LOG(log_level::warn, "rendezvous", "node ", p.id, " (group rank ", p.group_rank,
               ") has been silent for ", format_duration(settings_.heartbeat_timeout),
               "; re-forming the world of round ", last_round_);
    TROUPE_TRY(request_reform());
    return true;
  }
  return false;
}

expected<bool> node_rendezvous::should_reform() {
  if (last_round_ < 0) return false;
  // One pass of the watch waits at most heartbeat_timeout (op_timeout where shorter) on
  // the store, however many calls it makes; after a pass the store did not answer, a
  // quarter of that (the heartbeat's period), so that the launcher's watch of its own
  // workers goes on between passes while the store stays away.
  duration bound = settings_.op_timeout;
  if (settings_.heartbeat_timeout > duration::zero()) {
    bound = std::min(bound, settings_.heartbeat_timeout);
    if (store_unanswered_) bound = std::min(bound, settings_.heartbeat_timeout / 4);
  }
  watch_until_ = deadline::after(bound);
  auto r = watch_pass();
  watch_until_.reset();
  store_unanswered_ =
      !r && (r.error().code() == errc::timeout || r.error().code() == errc::connection_lost);
  return r;
}

expected<bool> node_rendezvous::watch_pass() {
  if (settings_.open_rounds) return follow_open_round();
  auto silent = check_heartbeats();
  if (!silent) return std::move(silent).error();
  if (*silent) return true;
  auto restart = counter(last_round_, "restart", 0);
  if (!restart) return std::move(restart).error();
  if (*restart > 0) return true;
  if (last_num_nodes_ >= settings_.max_nodes) return false;
  auto waiting = counter(last_round_, "waiting", 0);
  if (!waiting) return std::move(waiting).error();
  return *waiting > 0;
}

expected<void> node_rendezvous::finish(duration timeout, const std::function<bool()>& cancelled) {
  if (last_round_ < 0) return ok();
  auto n = counter(last_round_, "finished", 1);
  if (!n) return std::move(n).error();
  const std::string done_key = key(last_round_, "all_finished");
  // Whether `finished` nodes are all of the round: its closing count, and with open rounds
  // the nodes admitted late less those that left.
  const auto all_in = [&](std::int64_t finished) -> expected<bool> {
    if (!settings_.open_rounds) return finished >= last_num_nodes_;
    auto admitted = counter(last_round_, "admitted", 0);
    if (!admitted) return std::move(admitted).error();
    auto left = counter(last_round_, "left", 0);
    if (!left) return std::move(left).error();
    return finished >= last_num_nodes_ + *admitted - *left;
  };
  auto done = all_in(*n);
  if (!done) return std::move(done).error();
  if (*done) return store_.set(done_key, std::string_view("1"));
  const auto until = deadline::after(timeout);
  for (;;) {
    // Keep the heartbeat going: the others must not take this node for dead.
    auto silent = settings_.open_rounds ? follow_open_round() : check_heartbeats();
    if (!silent) return std::move(silent).error();
    if (*silent) return ok();
    auto got = store_.get(done_key, std::min(until.remaining(), duration(100)));
    if (got) return ok();
    if (got.error().code() != errc::timeout) return std::move(got).error();
    auto restart = counter(last_round_, "restart", 0);
    if (!restart) return std::move(restart).error();
    if (*restart > 0) return ok();
    if (settings_.open_rounds) {
      // A node that left may have been the last one the barrier waited for.
      auto finished = counter(last_round_, "finished", 0);
      if (!finished) return std::move(finished).error();
      n = finished;
      auto now_done = all_in(*finished);
      if (!now_done) return std::move(now_done).error();
      if (*now_done) return store_.set(done_key, std::string_view("1"));
    }
    if (cancelled && cancelled())
      return make_error(errc::aborted, "exit barrier of round ", last_round_, " cancelled");
    if (until.expired())
      return make_error(errc::timeout, "only ", *n, " of ", last_num_nodes_, " nodes of round ",
                        last_round_, " finished within ", format_duration(timeout));
  }
}

expected<void> node_rendezvous::request_reform() {
  if (last_round_ < 0 || reform_requested_) return ok();
  TROUPE_TRY(counter(last_round_, "restart", 1));
  reform_requested_ = true;
  return ok();
}

}  // namespace troupe::launcher
