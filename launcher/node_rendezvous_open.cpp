// Open rounds (--failure-policy replace): the parts of node_rendezvous that let nodes join
// a running round after it closed and leave it without re-forming the world. The keys
// are listed at the top of node_rendezvous.hpp; docs/launcher.md tells the story.
#include <charconv>
#include <thread>
#include <utility>

#include <troupe/core/log.hpp>
#include <troupe/launcher/node_rendezvous.hpp>

namespace troupe::launcher {

namespace {

// "<rank base>\n<node record>": what round/<r>/late/<slot> holds.
struct late_record {
  long rank_base = 0;
  node_info node;
};

expected<late_record> decode_late_record(std::string_view text) {
  const auto nl = text.find('\n');
  late_record out;
  const char* end = text.data() + (nl == std::string_view::npos ? 0 : nl);
  auto [p, ec] = std::from_chars(text.data(), end, out.rank_base);
  if (nl == std::string_view::npos || ec != std::errc() || p != end)
    return make_error(errc::protocol_error, "malformed late node record '", text, "'");
  auto n = decode_node_info(text.substr(nl + 1));
  if (!n) return std::move(n).error();
  out.node = std::move(*n);
  return out;
}

}  // namespace

expected<std::optional<round_result>> node_rendezvous::admit_late(
    long r, long count, const std::function<bool()>& cancelled) {
  bool said_full = false;
  for (;;) {
    // A round that re-forms or has finished takes nobody: the caller goes on to the next.
    auto restart = counter(r, "restart", 0);
    if (!restart) return std::move(restart).error();
    if (*restart > 0) return std::optional<round_result>();
    std::string done_key = key(r, "all_finished");
    auto done = store_.check(std::span(&done_key, 1), settings_.op_timeout);
    if (!done) return std::move(done).error();
    if (*done) return std::optional<round_result>();
    // Take a place; give it back when that makes more than MAX nodes.
    auto admitted = counter(r, "admitted", 1);
    if (!admitted) return std::move(admitted).error();
    auto left = counter(r, "left", 0);
    if (!left) return std::move(left).error();
    if (count + *admitted - *left <= settings_.max_nodes) break;
    TROUPE_TRY(counter(r, "admitted", -1));
    if (!said_full) {
      news_.push_back(strcat("the running round ", r, " is full (", settings_.max_nodes,
                             " nodes, the MAX of --nnodes); waiting as a standby until a node "
                             "leaves"));
      said_full = true;
    }
    if (cancelled && cancelled())
      return make_error(errc::aborted, "rendezvous cancelled by a signal");
    if (deadline_->expired())
      return make_error(errc::timeout, "node ", me_.id, " waited ",
                        format_duration(settings_.join_timeout),
                        " for a place in the running "
                        "round ",
                        r, ", which stayed at MAX (", settings_.max_nodes,
                        " nodes); raise MAX in --nnodes or stop one of the running nodes");
    std::this_thread::sleep_for(settings_.poll_interval);
  }
  // The next free global ranks: beyond the closed round's and those of earlier late nodes.
  auto taken = counter(r, "late_ranks", me_.nproc);
  if (!taken) return std::move(taken).error();
  auto nodes = read_round_nodes(r, count);
  if (!nodes) return std::move(nodes).error();
  round_result out = settle(r, count, std::move(*nodes));
  out.late = true;
  followed_ = false;  // what happened before it came is no news
  out.group_rank = slot_;
  group_rank_ = slot_;
  out.rank_base = out.world_size + static_cast<int>(*taken) - me_.nproc;
  out.world_size = out.rank_base + me_.nproc;
  out.nodes.push_back(me_);
  TROUPE_TRY(store_.set(key(r, strcat("late/", slot_)),
                        std::string_view(strcat(out.rank_base, '\n', encode_node_info(me_)))));
  TROUPE_LOG(log_level::info, "rendezvous", me_.id, " entered the running round ", r,
             " as group rank ", slot_, " with ranks ", out.rank_base, "-", out.world_size - 1);
  return std::optional<round_result>(std::move(out));
}

expected<bool> node_rendezvous::follow_open_round() {
  auto silent = check_heartbeats();  // with open rounds: marks silent peers gone
  if (!silent) return std::move(silent).error();
  auto restart = counter(last_round_, "restart", 0);
  if (!restart) return std::move(restart).error();
  if (*restart > 0) return true;
  const auto now = clock::now();
  if (now < next_scan_) return false;
  const duration every =
      settings_.heartbeat_timeout > duration::zero()
          ? std::min<duration>(std::chrono::seconds(1), settings_.heartbeat_timeout / 4)
          : duration(std::chrono::seconds(1));
  next_scan_ = now + every;
  // Arrivals: slots past the closing count with a late record.
  auto joined = counter(last_round_, "joined", 0);
  if (!joined) return std::move(joined).error();
  for (long s = last_num_nodes_; s < *joined; ++s) {
    if (s == group_rank_) continue;
    bool known = false;
    for (const auto& p : peers_) known = known || p.group_rank == s;
    if (known) continue;
    std::string k = key(last_round_, strcat("late/", s));
    auto present = store_.check(std::span(&k, 1), watch_timeout());
    if (!present) return std::move(present).error();
    if (!*present) continue;  // a standby, or a node that went on to a later round
    auto text = store_.get_string(k, watch_timeout());
    if (!text) return std::move(text).error();
    auto rec = decode_late_record(*text);
    if (!rec) return std::move(rec).error();
    peers_.push_back(
        {static_cast<int>(s), rec->node.id, std::string(), now, false, rec->node.nproc});
    if (followed_)
      news_.push_back(strcat("node ", rec->node.id, " arrived in the running round ", last_round_,
                             " as group rank ", s, " with ranks ", rec->rank_base, "-",
                             rec->rank_base + rec->node.nproc - 1,
                             "; its workers join the job, the others run on"));
  }
  // Departures: nodes marked gone, by themselves or by whoever found them silent.
  int live = 1;
  for (auto& p : peers_) {
    if (!p.gone) {
      std::string k = key(last_round_, strcat("gone/", p.group_rank));
      auto present = store_.check(std::span(&k, 1), watch_timeout());
      if (!present) return std::move(present).error();
      if (*present) {
        auto why = store_.get_string(k, watch_timeout());
        if (!why) return std::move(why).error();
        p.gone = true;
        if (followed_)
          news_.push_back(strcat("node ", p.id, " (group rank ", p.group_rank, ") left round ",
                                 last_round_, ": ", *why, "; the other nodes' workers run on"));
      }
    }
    if (!p.gone) ++live;
  }
  followed_ = true;
  if (live < settings_.min_nodes) {
    news_.push_back(strcat("only ", live, " of at least ", settings_.min_nodes,
                           " nodes (the MIN of --nnodes) are left in round ", last_round_,
                           "; re-forming the world, as the restart policy does"));
    TROUPE_TRY(request_reform());
    return true;
  }
  return false;
}

expected<std::string> node_rendezvous::mark_gone(int group_rank, std::string_view why) {
  // The first reason written stays; exactly one marker (the first to count) adds to `left`.
  auto text = store_.compare_set(key(last_round_, strcat("gone/", group_rank)), std::nullopt,
                                 to_bytes(why), watch_timeout());
  if (!text) return std::move(text).error();
  auto marks = counter(last_round_, strcat("gone_marks/", group_rank), 1);
  if (!marks) return std::move(marks).error();
  if (*marks == 1) TROUPE_TRY(counter(last_round_, "left", 1));
  return troupe::to_string(*text);
}

expected<void> node_rendezvous::leave(std::string_view reason) {
  if (last_round_ < 0 || left_) return ok();
  left_ = true;
  auto why = mark_gone(group_rank_, reason);
  if (!why) return std::move(why).error();
  return ok();
}

std::vector<std::string> node_rendezvous::take_news() { return std::exchange(news_, {}); }

node_rendezvous::running_view node_rendezvous::running() const {
  if (left_) return {};  // out of the round: nothing of it runs here any more
  running_view v{1, own_nproc_};
  for (const auto& p : peers_)
    if (!p.gone && p.group_rank != group_rank_) {
      ++v.nodes;
      v.workers += p.nproc;
    }
  return v;
}

}  // namespace troupe::launcher
