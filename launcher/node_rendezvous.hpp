// node_rendezvous: how the nodes of a job agree, round after round, on who is in the world
// and which ranks each node's workers get. Works over any store (memory_store in tests,
// the TCP store, etcd); the store given is already scoped to the job.
//
// Keys (all under the job's store):
//   current_round            the newest round number (advanced with compare_set)
//   round/<r>/joined         arrival counter; a node's slot is its arrival order
//   round/<r>/node/<slot>    the node's description (address, workers, rank hint, port)
//   round/<r>/closed         how many slots are in the round; written once, by whoever
//                            closes it first (compare_set), so every node agrees
//   round/<r>/restart        > 0: a member asked the world to re-form (failure, leaving)
//   round/<r>/waiting        > 0: a node arrived after the round closed
//   round/<r>/alive/<g>      group rank g's heartbeat counter, bumped while it runs
//   round/<r>/finished       how many nodes' workers all succeeded (the exit barrier)
//   round/<r>/all_finished   written by the last of them
// and, with open rounds (--failure-policy replace, below):
//   round/<r>/admitted       how many nodes joined the running round after it closed
//   round/<r>/late_ranks     how many global ranks those nodes took (beyond the round's)
//   round/<r>/late/<slot>    a late node's rank base and record; its group rank is <slot>
//   round/<r>/gone/<g>       why node g left the running round (written once)
//   round/<r>/gone_marks/<g> how many nodes marked g gone; the first adds 1 to `left`
//   round/<r>/left           how many nodes left it
//
// A round closes as soon as MAX nodes have joined, or once MIN have joined and
// last_call has passed without reaching MAX. A node whose slot is past the closing count
// is not admitted: it marks the round "waiting" and joins the next one, which the members
// re-form into when the world is below MAX (a full world keeps it waiting until a member
// asks to re-form). Group ranks follow the --node-rank hints, then arrival order;
// global ranks are consecutive per node in group-rank order.
//
// A node that dies without asking to re-form (killed, powered off) stops bumping its
// heartbeat; the others re-form the world once it has been silent for heartbeat_timeout
// (measured on each node's own clock; no clocks are compared across machines).
//
// Open rounds (settings.open_rounds, for --failure-policy replace): a closed round keeps
// running while nodes come and go. A node arriving after it closed is admitted into it
// (while fewer than MAX nodes are in) with its slot as group rank and the next free global
// ranks; a node that leaves (leave(), or a heartbeat silent for heartbeat_timeout) is
// marked gone. Neither re-forms the world; only fewer than MIN nodes left, or a member
// asking for it, does. Implemented in node_rendezvous_open.cpp.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe::launcher {

/// What a node tells the others about itself.
struct node_info {
  /// Address other nodes reach this node at (becomes MASTER_ADDR when it holds rank 0).
  std::string addr = "127.0.0.1";
  /// Workers it runs.
  int nproc = 1;
  /// --node-rank, or -1.
  int node_rank = -1;
  /// A free port on this node, offered as MASTER_PORT.
  int free_port = 0;
  /// A name for logs (host and pid).
  std::string id;
};

struct rendezvous_settings {
  int min_nodes = 1;
  int max_nodes = 1;
  /// How long a node waits for a round it can enter to close.
  duration join_timeout = std::chrono::seconds(600);
  /// After MIN nodes are in, how long to wait for more before closing.
  duration last_call = std::chrono::seconds(1);
  /// How often a waiting node re-reads the arrival counter.
  duration poll_interval = std::chrono::milliseconds(20);
  /// Timeout of each store call.
  duration op_timeout = std::chrono::seconds(30);
  /// A member whose heartbeat has not moved for this long is taken for dead (zero: never).
  /// Heartbeats are written and read every heartbeat_timeout / 4, from should_reform().
  duration heartbeat_timeout = std::chrono::seconds(15);
  /// Open rounds (see the top of this file): late nodes are admitted into the running
  /// round and leaving nodes are let go, instead of re-forming the world.
  bool open_rounds = false;
};

/// One closed round as this node sees it.
struct round_result {
  long round = 0;
  int group_rank = 0;
  /// Every node of the round, in group-rank order.
  std::vector<node_info> nodes;
  /// The global rank of this node's local rank 0, and the world's size.
  int rank_base = 0;
  int world_size = 0;
  /// Open rounds: this node was admitted after the round closed (its group rank is its
  /// slot, `nodes` ends with itself, and world_size is rank_base + its workers).
  bool late = false;
};

class node_rendezvous {
 public:
  /// `job_store` must outlive this object.
  node_rendezvous(store& job_store, rendezvous_settings settings);

  /// Joins the next round (asking the members of this node's previous round, if any, to
  /// re-form). Returns at once; await_round() waits for it to close. Calling join()
  /// before stopping the old workers lets the new round form while they stop.
  expected<void> join(const node_info& me);

  /// Waits until this node is admitted to a closed round (moving on to later rounds when
  /// it arrived too late for one). Fails with errc::timeout when no round it can enter
  /// closes within join_timeout (the message says how many of MIN nodes came), and with
  /// errc::aborted when `cancelled` returns true (checked every poll_interval).
  expected<round_result> await_round(const std::function<bool()>& cancelled = {});

  /// join() then await_round().
  expected<round_result> next_round(const node_info& me,
                                    const std::function<bool()>& cancelled = {});

  /// Whether the world of this node's last round should re-form: a member asked for it,
  /// a member's heartbeat went silent, or a node is waiting and the world is below MAX.
  /// Also bumps this node's heartbeat when one is due; call it regularly while running.
  /// Its store calls wait at most heartbeat_timeout (op_timeout where that is shorter), so
  /// that a store cut off from this node fails the call by the time the others have
  /// stopped waiting for this node's heartbeat.
  expected<bool> should_reform();

  /// Asks the members of this node's last round to re-form (e.g. before leaving).
  expected<void> request_reform();

  /// Open rounds: says that this node leaves its running round, so that the others let it
  /// go without re-forming (they only log it). Idempotent.
  expected<void> leave(std::string_view reason);

  /// Open rounds: what changed since the last call (a node arrived or left), one line
  /// each for the launcher's log. Filled by should_reform() and finish().
  std::vector<std::string> take_news();

  /// The exit barrier: records that this node's workers all succeeded in its last round
  /// and waits until every node of the round has said the same, so that a node hosting
  /// the store does not take it away from nodes still running. Returns early (ok) when a
  /// member asks to re-form (it failed or left: nobody else will finish this round), and
  /// fails with errc::timeout after `timeout`, or errc::aborted when `cancelled` says so.
  expected<void> finish(duration timeout, const std::function<bool()>& cancelled = {});

  /// The round this node last joined, or -1.
  long last_round() const noexcept { return last_round_; }

  /// Open rounds: the nodes of this node's running round that have not left, itself
  /// included, and the workers they run, as should_reform() last followed them (nodes
  /// arrive and leave while the round runs). Closed rounds: the round as it closed. After
  /// leave(): none.
  struct running_view {
    int nodes = 0;
    int workers = 0;
  };
  running_view running() const;

 private:
  std::string key(long round, std::string_view name) const;
  expected<long> read_current_round();
  expected<void> advance_current_round(long to);
  // Adds `delta` to the round's counter `name`, within watch_timeout().
  expected<std::int64_t> counter(long round, std::string_view name, std::int64_t delta);
  // The timeout of a store call: within should_reform(), the time left of its pass
  // (watch_until_); elsewhere op_timeout. A pass that has waited heartbeat_timeout on the
  // store has missed a heartbeat, the other nodes take this node for gone, and the
  // launcher's watch of its own workers must not stall behind the store for longer.
  duration watch_timeout() const;
  // should_reform()'s checks, within watch_until_.
  expected<bool> watch_pass();

  store& store_;
  rendezvous_settings settings_;
  node_info me_;
  std::optional<deadline> deadline_;
  std::optional<deadline> watch_until_;  // set during a should_reform() pass
  bool store_unanswered_ = false;        // the last pass failed for want of an answer
  long joining_ = -1;
  int slot_ = -1;
  long last_round_ = -1;
  int last_num_nodes_ = 0;
  bool reform_requested_ = false;
  // Heartbeats of the last round's members (and, with open rounds, of late nodes).
  expected<bool> check_heartbeats();
  // Open rounds: the admission of a node that arrived after round `r` closed with `count`
  // nodes; nullopt when it cannot enter (the round re-forms or finished).
  expected<std::optional<round_result>> admit_late(long r, long count,
                                                   const std::function<bool()>& cancelled);
  // Open rounds: arrivals, departures and silent peers; true when the world must re-form
  // (fewer than MIN nodes left).
  expected<bool> follow_open_round();
  // Open rounds: marks node `group_rank` gone from the last round (once, whoever is first);
  // returns the reason recorded, which may be an earlier marker's.
  expected<std::string> mark_gone(int group_rank, std::string_view why);
  expected<std::vector<node_info>> read_round_nodes(long r, long count);
  round_result settle(long r, long count, std::vector<node_info> nodes);
  struct peer {
    int group_rank = 0;
    std::string id;
    std::string seen_beat;
    clock::time_point seen_at{};
    bool gone = false;
    int nproc = 0;
  };
  int group_rank_ = 0;
  int own_nproc_ = 0;
  std::int64_t beats_ = 0;
  clock::time_point next_beat_{};
  std::vector<peer> peers_;
  clock::time_point next_scan_{};
  bool followed_ = true;
  bool left_ = false;
  std::vector<std::string> news_;
};

/// Encodes and decodes a node_info for the store.
std::string encode_node_info(const node_info& n);
expected<node_info> decode_node_info(std::string_view text);

}  // namespace troupe::launcher
