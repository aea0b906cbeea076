// The part of a gloo group that runs its operations, once it has connected and chosen its
// transport: the task queue, the worker and point-to-point threads, the inline path for
// small waited-for collectives, the sticky error and the failure path (roll call,
// connections broken, waiters told), abort and shutdown. gloo_group.cpp builds on it: it
// connects, chooses the transport, checks each operation's arguments and submits the
// operation's body here. Internal to collectives/gloo.
//
// Threading: one worker thread per group runs the collectives in call order, one at a
// time, through the transport (a caller waiting for a small one next in line runs it on
// its own thread instead: run_inline); a second thread waits for point-to-point
// transfers, which the worker only posts, so that a send and a recv posted back to back
// cannot deadlock. An operation's error (Gloo's exceptions turned into errors by the
// transport, gloo_errors::guard) becomes the group's sticky error on these threads; nothing
// is thrown to the caller.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <troupe/collectives/gloo/group_metrics.hpp>
#include <troupe/collectives/gloo/ring_queue.hpp>
#include <troupe/collectives/gloo/tcp_transport.hpp>
#include <troupe/collectives/gloo/transport.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/collectives/work.hpp>
#include <troupe/core/span_clock.hpp>
#include <troupe/core/unique_function.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_runner {

class group_runner : public process_group, public std::enable_shared_from_this<group_runner> {
 public:
  /// Shuts down (see shutdown) with a 30 s deadline.
  ~group_runner() override;

  /// The group's sticky error, if it failed or was aborted.
  std::optional<troupe::error> failure() const override;
  /// Records `why` as the sticky error (unless one is already there), fails every queued
  /// operation with it at once and ends the running ones by closing the transport under
  /// them. Any thread; returns without waiting for the running operations.
  void abort(troupe::error why) override;
  /// Fails queued operations, gives the running ones until `timeout` before closing the
  /// transport under them, joins the threads and releases the transport. Idempotent.
  void shutdown(duration timeout) override;

 protected:
  /// The group `spec` describes, not yet started; its store is spec.root_store under
  /// "<name>/gloo".
  explicit group_runner(const group_spec& spec);

  /// What a point-to-point body hands back: the transfer it posted, for the p2p thread to
  /// wait for, so that the worker moves on to the next operation meanwhile.
  struct handed_off {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool is_send;
    int peer;
    std::chrono::milliseconds timeout;
  };
  /// What an operation's body is given: its step (number, tag, timeout left for its
  /// transfers after the roll call's share) and, for a point-to-point body, where to put
  /// the transfer it posted.
  struct run_ctx {
    gloo_transport::op_step step;
    std::optional<handed_off>* handoff = nullptr;  // null for collectives
  };
  /// An operation's body: runs on the thread running the group's operation (the worker or
  /// an inline waiter), one at a time; an error fails the group.
  using body_fn = unique_function<expected<void>(const run_ctx&)>;

  /// Starts the threads, with `tcp` the group's connected mesh and `transport` the one
  /// chosen to run its collectives (`tcp` itself or one that holds it). Once, after connect.
  void start(std::shared_ptr<gloo_transport::tcp> tcp,
             std::shared_ptr<gloo_transport::transport> transport);

  /// Queues operation `op` ("allreduce", ...: a literal) and returns its work; `peer` >= 0
  /// for a point-to-point transfer. `bytes` is the tensor's size when a small collective
  /// may be left to its waiter (see group_runner.cpp), `metric_bytes` the size the metrics
  /// record when `bytes` is not given. Fails the work at once after abort or shutdown.
  work submit(std::string_view op, duration timeout, body_fn body, int peer = -1,
              std::size_t bytes = SIZE_MAX, std::size_t metric_bytes = SIZE_MAX);

  /// The group's store, namespaced for it.
  const std::shared_ptr<store>& group_store() const noexcept { return store_; }
  /// The chosen transport and the TCP mesh; only from a body (set before the threads
  /// start, released after they end).
  gloo_transport::transport& transport() const noexcept { return *transport_; }
  gloo_transport::tcp& tcp() const noexcept { return *tcp_; }

 private:
  struct task {
    // What the task is ("allreduce #4 on group ..."): its work's description.
    const std::string& what() const { return done.description(); }
    std::uint64_t seq;
    duration timeout;
    work::completer done;
    body_fn body;
    int peer = -1;  // the other rank of a point-to-point transfer
    // The worker leaves it to its waiter until then (min: start at once; max: held, its
    // grace not started yet); see submit().
    clock::time_point start_by = clock::time_point::min();
    std::string_view op;           // "allreduce", ...: a literal, for the metrics
    std::size_t bytes = SIZE_MAX;  // the tensor's bytes; SIZE_MAX: not given
  };
  struct p2p_wait {
    std::string what;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool is_send;
    int peer;
    clock::time_point deadline;
    duration timeout;
    work::completer done;
  };

  static troupe::error stopped_by(const std::string& what, const troupe::error& why);
  void break_connections();
  void urge(std::uint64_t seq);
  void run_worker();
  void run_inline(std::uint64_t seq);
  void execute(task& t);
  void fail_group(task& t, const troupe::error& cause, duration budget);
  void run_p2p();
  void gauge_queue();

  std::shared_ptr<store> store_;
  // The group's full mesh, and the transport chosen at connect (tcp_ itself, or one that
  // holds it); null until started and after shutdown (under teardown_mu_ there).
  std::shared_ptr<gloo_transport::tcp> tcp_;
  std::shared_ptr<gloo_transport::transport> transport_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable p2p_cv_;
  ring_queue<task> queue_;
  std::deque<p2p_wait> p2p_queue_;
  std::condition_variable idle_cv_;
  std::uint64_t seq_ = 0;
  std::uint64_t p2p_seq_ = 0;
  bool stopping_ = false;
  bool busy_ = false;
  // describe(*this), made by the first submit (under mu_), shared by the works.
  std::shared_ptr<const std::string> description_;
  // The collectives' works call these to run or urge them (run_inline, urge); made by the
  // first submit (under mu_), shared by every work.
  std::shared_ptr<const work::hooks> hooks_;
  // The metrics of the collectives that succeeded (only execute() records, under busy_).
  gloo_metrics::op_metrics metrics_;
  // The operations' starts and spans (span_clock.hpp; only execute() reads it, under busy_).
  span_clock::stamper stamper_;
  // What this group adds to the process's queue-depth gauge (gauge_queue(), under mu_).
  std::int64_t gauged_ = 0;
  bool worker_parked_ = false;  // the worker waits for a notify, not polling
  // Held collectives their waiters ran in a row, up to inline_streak (group_runner.cpp):
  // how often the worker looks for held ones.
  std::uint32_t inline_streak_ = 0;
  std::uint64_t submits_ = 0;  // operations queued so far (the worker's parking)
  bool p2p_busy_ = false;
  // The transfer the p2p thread waits for (under mu_), so that abort() can end its wait.
  gloo::transport::UnboundBuffer* p2p_current_ = nullptr;
  bool p2p_current_is_send_ = false;
  std::optional<troupe::error> failure_;
  bool aborted_ = false;  // abort() ran; failure_ holds its error (under mu_)
  // Orders abort()'s closing of the transport with shutdown()'s release of it.
  std::mutex teardown_mu_;
  std::thread worker_;
  std::thread p2p_thread_;
};

}  // namespace troupe::collectives::gloo_runner
