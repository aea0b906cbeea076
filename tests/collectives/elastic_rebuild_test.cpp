// How an elastic group carries a communicator across epochs (comm_plan.hpp), checked
// without a GPU: a backend that records what it is asked to do stands in for nccl. Its
// groups keep their "communicator" when retired, shrink it in rebuild_native(), and hold a
// barrier until the group is retired or aborted (the work pending at an epoch change).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/collectives/registry.hpp>
#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include "support/membership_join.hpp"

using namespace std::chrono_literals;
using troupe::test::join_membership;
using namespace troupe;
using namespace troupe::collectives;

namespace {

// What the recording backend was asked to do, one line per step.
struct recorder {
  std::mutex mu;
  std::vector<std::string> events;
  std::set<std::string> old_library;  // members ("<name>") whose NCCL lacks ncclCommShrink

  void add(std::string e) {
    std::lock_guard lk(mu);
    events.push_back(std::move(e));
  }
  std::size_t count(const std::string& prefix) {
    std::lock_guard lk(mu);
    std::size_t n = 0;
    for (const auto& e : events)
      if (e.rfind(prefix, 0) == 0) ++n;
    return n;
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string out;
    for (const auto& e : events) out += e + "\n";
    return out;
  }
};

recorder& record() {
  static recorder r;
  return r;
}

// "<group name> r<rank>".
std::string who(const process_group& g) { return strcat(g.name(), " r", g.rank()); }

class recording_group final : public process_group {
 public:
  recording_group(group_spec s, std::string member)
      : process_group(std::move(s)), member_(std::move(member)) {}

  std::string_view backend_name() const noexcept override { return "recording"; }
  bool supports(dtype, reduce_op) const noexcept override { return true; }

  work allreduce(tensor_view, const allreduce_options&) override { return done(); }
  work broadcast(tensor_view, const broadcast_options&) override { return done(); }
  work reduce(tensor_view, const reduce_options&) override { return done(); }
  work allgather(tensor_view, tensor_view, const allgather_options&) override { return done(); }
  work gather(tensor_view, tensor_view, const gather_options&) override { return done(); }
  work scatter(tensor_view, tensor_view, const scatter_options&) override { return done(); }
  work reduce_scatter(tensor_view, tensor_view, const reduce_scatter_options&) override {
    return done();
  }
  work all_to_all(tensor_view, tensor_view, const all_to_all_options&) override { return done(); }
  work send(tensor_view, int, const p2p_options&) override { return done(); }
  work recv(tensor_view, int, const p2p_options&) override { return done(); }
  // Held until the group is retired or aborted.
  work barrier(const barrier_options&) override {
    std::lock_guard lk(mu_);
    if (failure_) return work::completed(*failure_);
    auto [w, c] = work::make(strcat("barrier on ", who(*this)));
    held_.push_back(c);
    return w;
  }

  std::optional<troupe::error> failure() const override {
    std::lock_guard lk(mu_);
    return failure_;
  }
  void abort(troupe::error why) override {
    {
      std::lock_guard lk(mu_);
      if (live_) record().add(strcat("abort ", who(*this)));
      live_ = false;
    }
    stop(std::move(why));
  }
  void retire(troupe::error why) override {
    record().add(strcat("retire ", who(*this)));
    stop(std::move(why));
  }
  void shutdown(duration) override {
    std::lock_guard lk(mu_);
    live_ = false;
  }
  std::optional<comm_state> rebuild_state() const override {
    std::lock_guard lk(mu_);
    comm_state s;
    s.pending_work = had_pending_;
    s.live = live_;
    std::lock_guard rk(record().mu);
    s.library_version = record().old_library.count(member_) ? 22605 : 22809;
    return s;
  }
  expected<std::shared_ptr<process_group>> rebuild_native(const group_spec& next,
                                                          const comm_plan& plan) override {
    if (plan.action == comm_action::recreate) return std::shared_ptr<process_group>();
    {
      std::lock_guard lk(mu_);
      live_ = false;
    }
    record().add(strcat("shrink ", next.name, " r", next.rank, " from r", rank(), " excluding ",
                        format_ranks(plan.excluded), plan.abort_first ? " abort" : " default"));
    return std::shared_ptr<process_group>(std::make_shared<recording_group>(next, member_));
  }

 private:
  static work done() { return work::completed(ok()); }
  void stop(troupe::error why) {
    std::vector<work::completer> held;
    {
      std::lock_guard lk(mu_);
      if (!failure_) failure_ = why;
      had_pending_ = had_pending_ || !held_.empty();
      held.swap(held_);
    }
    for (auto& c : held) c.complete(why);
  }

  std::string member_;
  mutable std::mutex mu_;
  std::optional<troupe::error> failure_;
  std::vector<work::completer> held_;
  bool had_pending_ = false;
  bool live_ = true;
};

void register_recording() {
  static const bool once = [] {
    backend_info b;
    b.name = "recording";
    b.description = "records what an elastic group asks of a communicator (tests)";
    b.viable = [] { return true; };
    b.create = [](const group_spec& s) -> expected<std::shared_ptr<process_group>> {
      // The member name is the test's: the store prefix of its membership says it.
      auto g = std::make_shared<recording_group>(s, strcat("rank", s.rank));
      record().add(strcat("create ", who(*g)));
      return std::shared_ptr<process_group>(std::move(g));
    };
    REQUIRE(register_backend(std::move(b)).has_value());
    return true;
  }();
  (void)once;
}

std::unique_ptr<elastic_group> follow(std::shared_ptr<membership::service> m,
                                      std::shared_ptr<store> s, std::string name) {
  elastic_options o;
  o.name = std::move(name);
  o.backend = "recording";
  o.build_timeout = 10s;
  auto g = elastic_group::make(std::move(m), std::move(s), o);
  REQUIRE_MESSAGE(g.has_value(), g.error().to_string());
  return std::move(*g);
}

// Every group rebuilds for epoch `n` together (each in its own thread).
void rebuild_all(const std::vector<elastic_group*>& gs, std::uint64_t n) {
  for (auto* g : gs) REQUIRE(g->wait_for_change(n - 1, 10s).has_value());
  std::vector<std::optional<expected<elastic_group::view>>> out(gs.size());
  std::vector<std::thread> ts;
  for (std::size_t i = 0; i < gs.size(); ++i)
    ts.emplace_back([&, i] { out[i] = gs[i]->rebuild(15s); });
  for (auto& t : ts) t.join();
  for (auto& v : out) {
    REQUIRE_MESSAGE(v->has_value(), v->error().to_string());
    CHECK((**v).epoch.number == n);
    CHECK((**v).group->size() == static_cast<int>(gs.size()));
  }
}

}  // namespace

TEST_CASE(
    "an elastic group shrinks its communicator when members only leave and re-creates it when one "
    "comes") {
  register_recording();
  auto s = std::make_shared<memory_store>();
  auto a = join_membership(s, "a");
  auto b = join_membership(s, "b");
  auto c = join_membership(s, "c");
  auto ga = follow(a, s, "carry1");
  auto gb = follow(b, s, "carry1");
  auto gc = follow(c, s, "carry1");
  rebuild_all({ga.get(), gb.get(), gc.get()}, 3);
  CHECK(record().count("create carry1/epoch-3 ") == 3);

  // c leaves while a waits in a barrier that c never joins: it fails at once, saying so.
  auto pending = ga->current().group->barrier({});
  gc->shutdown(5s);
  REQUIRE(c->shutdown(5s));
  auto r = pending.wait(5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::membership_changed);
  CHECK(r.error().message().find("to epoch 4") != std::string::npos);
  CHECK(r.error().message().find("left: c (rank 2, host here") != std::string::npos);

  // a and b shrink excluding old rank 2; a had pending work, so both abort it first.
  rebuild_all({ga.get(), gb.get()}, 4);
  INFO(record().all());
  CHECK(record().count("retire carry1/epoch-3 r0") == 1);
  CHECK(record().count("shrink carry1/epoch-4 r0 from r0 excluding [2] abort") == 1);
  CHECK(record().count("shrink carry1/epoch-4 r1 from r1 excluding [2] abort") == 1);
  CHECK(record().count("create carry1/epoch-4") == 0);

  // d joins: everyone re-creates, the old communicators aborted first.
  auto d = join_membership(s, "d");
  auto gd = follow(d, s, "carry1");
  rebuild_all({ga.get(), gb.get(), gd.get()}, 5);
  CHECK(record().count("create carry1/epoch-5 ") == 3);
  CHECK(record().count("abort carry1/epoch-4 ") == 2);
  CHECK(record().count("shrink carry1/epoch-5") == 0);

  // d leaves with nothing pending: a shrink with the default flags.
  gd->shutdown(5s);
  REQUIRE(d->shutdown(5s));
  rebuild_all({ga.get(), gb.get()}, 6);
  CHECK(record().count("shrink carry1/epoch-6 r0 from r0 excluding [2] default") == 1);
  CHECK(record().count("shrink carry1/epoch-6 r1 from r1 excluding [2] default") == 1);

  ga->shutdown(5s);
  gb->shutdown(5s);
  CHECK(a->shutdown(5s));
  CHECK(b->shutdown(5s));
}

TEST_CASE("when one member cannot shrink (an NCCL older than 2.27), every member re-creates") {
  register_recording();
  auto s = std::make_shared<memory_store>();
  auto a = join_membership(s, "a");
  auto b = join_membership(s, "b");
  auto c = join_membership(s, "c");
  auto ga = follow(a, s, "carry2");
  auto gb = follow(b, s, "carry2");
  auto gc = follow(c, s, "carry2");
  rebuild_all({ga.get(), gb.get(), gc.get()}, 3);
  {
    std::lock_guard lk(record().mu);
    record().old_library.insert("rank1");  // b's group, rank 1 in epoch 3
  }
  gc->shutdown(5s);
  REQUIRE(c->shutdown(5s));
  rebuild_all({ga.get(), gb.get()}, 4);
  INFO(record().all());
  CHECK(record().count("shrink carry2/") == 0);
  CHECK(record().count("create carry2/epoch-4 ") == 2);
  CHECK(record().count("abort carry2/epoch-3 r0") == 1);
  CHECK(record().count("abort carry2/epoch-3 r1") == 1);
  {
    std::lock_guard lk(record().mu);
    record().old_library.clear();
  }
  ga->shutdown(5s);
  gb->shutdown(5s);
  CHECK(a->shutdown(5s));
  CHECK(b->shutdown(5s));
}
