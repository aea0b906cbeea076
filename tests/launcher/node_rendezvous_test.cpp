// node_rendezvous over an in-process store, with threads as nodes.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>

#include <troupe/launcher/node_rendezvous.hpp>
#include <troupe/store/memory_store.hpp>

using namespace troupe;
using namespace troupe::launcher;
using namespace std::chrono_literals;

namespace {

rendezvous_settings settings(int min, int max, duration last_call = 100ms) {
  rendezvous_settings s;
  s.min_nodes = min;
  s.max_nodes = max;
  s.last_call = last_call;
  s.join_timeout = 10s;
  s.poll_interval = 5ms;
  return s;
}

node_info node(int nproc, int hint = -1, std::string addr = "127.0.0.1") {
  node_info n;
  n.nproc = nproc;
  n.node_rank = hint;
  n.addr = std::move(addr);
  n.free_port = 1000 + (hint < 0 ? 0 : hint);
  return n;
}

// Runs next_round on `count` threads, each with its own rendezvous object.
std::vector<expected<round_result>> run_nodes(store& s, std::vector<node_info> nodes,
                                              rendezvous_settings rs) {
  std::vector<expected<round_result>> out(nodes.size(), make_error(errc::internal, "not run"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    threads.emplace_back([&, i] {
      node_rendezvous r(s, rs);
      out[i] = r.next_round(nodes[i]);
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("three fixed nodes form one round with consecutive ranks in node-rank order") {
  memory_store s;
  auto results = run_nodes(s, {node(2, 2, "c"), node(2, 0, "a"), node(2, 1, "b")}, settings(3, 3));
  for (auto& r : results) REQUIRE_MESSAGE(r, r.error().to_string());
  CHECK(results[0]->group_rank == 2);
  CHECK(results[1]->group_rank == 0);
  CHECK(results[2]->group_rank == 1);
  CHECK(results[0]->rank_base == 4);
  CHECK(results[1]->rank_base == 0);
  CHECK(results[2]->rank_base == 2);
  for (auto& r : results) {
    CHECK(r->world_size == 6);
    CHECK(r->round == 0);
    REQUIRE(r->nodes.size() == 3);
    CHECK(r->nodes.front().addr == "a");  // the master is the group-rank 0 node
  }
}

TEST_CASE("without rank hints every node still gets a distinct group rank") {
  memory_store s;
  auto results = run_nodes(s, {node(1), node(1), node(1), node(1)}, settings(4, 4));
  std::set<int> ranks;
  for (auto& r : results) {
    REQUIRE(r);
    ranks.insert(r->group_rank);
    CHECK(r->rank_base == r->group_rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
}

TEST_CASE("an elastic round closes after the last call once MIN nodes are in") {
  memory_store s;
  auto results = run_nodes(s, {node(1), node(1)}, settings(2, 4, 50ms));
  for (auto& r : results) {
    REQUIRE(r);
    CHECK(r->world_size == 2);
  }
}

TEST_CASE("below MIN nodes the rendezvous times out and says how many came") {
  memory_store s;
  auto rs = settings(2, 2);
  rs.join_timeout = 200ms;
  node_rendezvous r(s, rs);
  auto res = r.next_round(node(1));
  REQUIRE(!res);
  CHECK(res.error().code() == errc::timeout);
  CHECK(res.error().message().find("1 of at least 2 nodes") != std::string::npos);
}

TEST_CASE("a cancelled rendezvous returns aborted") {
  memory_store s;
  node_rendezvous r(s, settings(2, 2));
  auto res = r.next_round(node(1), [] { return true; });
  REQUIRE(!res);
  CHECK(res.error().code() == errc::aborted);
}

TEST_CASE("a node arriving after the round closed makes the members re-form a bigger world") {
  memory_store s;
  auto rs = settings(2, 3, 30ms);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(2)); });
  auto rb = b.next_round(node(2));
  ta.join();
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(rb->world_size == 4);
  CHECK(!*a.should_reform());

  // A third node arrives: it joins round 0, finds it closed, and waits in round 1.
  node_rendezvous c(s, rs);
  expected<round_result> rc = make_error(errc::internal, "");
  std::thread tc([&] { rc = c.next_round(node(2)); });
  bool noticed = false;
  for (int i = 0; i < 2000 && !noticed; ++i) {
    noticed = *a.should_reform();
    if (!noticed) std::this_thread::sleep_for(5ms);
  }
  REQUIRE(noticed);
  CHECK(*b.should_reform());
  expected<round_result> ra2 = make_error(errc::internal, "");
  std::thread ta2([&] { ra2 = a.next_round(node(2)); });
  auto rb2 = b.next_round(node(2));
  ta2.join();
  tc.join();
  REQUIRE(ra2);
  REQUIRE(rb2);
  REQUIRE(rc);
  for (auto* r : {&*ra2, &*rb2, &*rc}) {
    CHECK(r->round == 1);
    CHECK(r->world_size == 6);
  }
  std::set<int> bases{ra2->rank_base, rb2->rank_base, rc->rank_base};
  CHECK(bases == std::set<int>{0, 2, 4});
}

TEST_CASE("a member asking to re-form after a failure takes everyone to the next round") {
  memory_store s;
  auto rs = settings(2, 2);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(1)); });
  REQUIRE(b.next_round(node(1)));
  ta.join();
  REQUIRE(ra);
  CHECK(!*b.should_reform());
  REQUIRE(a.join(node(1)));  // a's workers failed: it moves on first
  CHECK(*b.should_reform());
  expected<round_result> rb = make_error(errc::internal, "");
  std::thread tb([&] { rb = b.next_round(node(1)); });
  auto ra2 = a.await_round();
  tb.join();
  REQUIRE(ra2);
  REQUIRE(rb);
  CHECK(ra2->round == 1);
  CHECK(rb->round == 1);
  CHECK(rb->world_size == 2);
}

TEST_CASE("node records survive encoding") {
  node_info n = node(3, 7, "host-1");
  n.id = "host-1:42";
  auto back = decode_node_info(encode_node_info(n));
  REQUIRE(back);
  CHECK(back->addr == "host-1");
  CHECK(back->nproc == 3);
  CHECK(back->node_rank == 7);
  CHECK(back->free_port == 1007);
  CHECK(back->id == "host-1:42");
  CHECK(!decode_node_info("garbage"));
}

TEST_CASE("the exit barrier holds a finished node until every node of the round finished") {
  memory_store s;
  auto rs = settings(2, 2);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(1)); });
  REQUIRE(b.next_round(node(1)));
  ta.join();
  REQUIRE(ra);
  std::atomic<bool> a_done{false};
  std::thread fa([&] {
    CHECK(a.finish(10s));
    a_done = true;
  });
  // Once a has said it finished, it waits: the barrier is not open yet.
  std::vector<std::string> finished{"round/0/finished"};
  while (!*s.check(finished, 1s)) std::this_thread::yield();
  std::vector<std::string> open{"round/0/all_finished"};
  CHECK(!*s.check(open, 1s));
  CHECK(!a_done);
  CHECK(b.finish(10s));
  fa.join();
  CHECK(a_done);
}

TEST_CASE("the exit barrier lets go when a member gives up instead of finishing") {
  memory_store s;
  auto rs = settings(2, 2);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(1)); });
  REQUIRE(b.next_round(node(1)));
  ta.join();
  REQUIRE(ra);
  std::thread fa([&] { CHECK(a.finish(10s)); });
  REQUIRE(b.request_reform());
  fa.join();
}

TEST_CASE("a member whose heartbeat stops is taken for dead after the heartbeat timeout") {
  memory_store s;
  auto rs = settings(2, 2);
  rs.heartbeat_timeout = 200ms;
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(1)); });
  REQUIRE(b.next_round(node(1)));
  ta.join();
  REQUIRE(ra);
  // b keeps beating; a stops calling should_reform (as if its node died).
  CHECK(!*a.should_reform());
  const auto start = std::chrono::steady_clock::now();
  bool dead = false;
  while (!dead && std::chrono::steady_clock::now() - start < 5s) {
    dead = *b.should_reform();
    if (!dead) std::this_thread::sleep_for(10ms);
  }
  CHECK(dead);
  CHECK(std::chrono::steady_clock::now() - start >= 200ms);
}

namespace {

// Calls should_reform on `r` until it says true or `for_how_long` passes, gathering the
// news; returns whether it said true.
// Open rounds of 2 to 3 nodes with a 30 ms last call and this rendezvous heartbeat timeout.
rendezvous_settings open_round_settings(duration heartbeat_timeout) {
  auto rs = settings(2, 3, 30ms);
  rs.open_rounds = true;
  rs.heartbeat_timeout = heartbeat_timeout;
  return rs;
}

// a, b and c (one worker each, node-rank hints 0, 1, 2) enter one round together.
void form_round_of_three(node_rendezvous& a, node_rendezvous& b, node_rendezvous& c) {
  auto results = std::vector<expected<round_result>>(3, make_error(errc::internal, ""));
  std::thread ta([&] { results[0] = a.next_round(node(1, 0, "a")); });
  std::thread tb([&] { results[1] = b.next_round(node(1, 1, "b")); });
  results[2] = c.next_round(node(1, 2, "c"));
  ta.join();
  tb.join();
  for (auto& r : results) REQUIRE_MESSAGE(r, r.error().to_string());
}

bool follow_for(node_rendezvous& r, duration for_how_long, std::string& news) {
  const auto until = std::chrono::steady_clock::now() + for_how_long;
  while (std::chrono::steady_clock::now() < until) {
    auto change = r.should_reform();
    REQUIRE_MESSAGE(change, change.error().to_string());
    for (const auto& line : r.take_news()) news += line + "\n";
    if (*change) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

}  // namespace

TEST_CASE(
    "with open rounds a late node enters the running round with the next ranks and "
    "nobody re-forms") {
  memory_store s;
  auto rs = open_round_settings(10s);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  expected<round_result> ra = make_error(errc::internal, "");
  std::thread ta([&] { ra = a.next_round(node(2, 0, "a")); });
  auto rb = b.next_round(node(2, 1, "b"));
  ta.join();
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(!ra->late);

  node_rendezvous c(s, rs);
  auto rc = c.next_round(node(3, -1, "c"));
  REQUIRE_MESSAGE(rc, rc.error().to_string());
  CHECK(rc->late);
  CHECK(rc->round == ra->round);
  CHECK(rc->group_rank == 2);
  CHECK(rc->rank_base == 4);
  CHECK(rc->world_size == 7);
  CHECK(rc->nodes.front().addr == "a");  // MASTER_ADDR stays the running job's

  CHECK(a.running().nodes == 2);  // before it follows the round
  std::string news;
  CHECK(!follow_for(a, 1500ms, news));
  CHECK(news.find("arrived in the running round 0 as group rank 2 with ranks 4-6") !=
        std::string::npos);
  CHECK(!*b.should_reform());
  CHECK(!*c.should_reform());
  // What /status shows: the running round's nodes and workers, the late one included.
  CHECK(a.running().nodes == 3);
  CHECK(a.running().workers == 7);
  CHECK(c.running().nodes == 3);
  CHECK(c.running().workers == 7);
  REQUIRE(c.leave("stopped by a test"));
  CHECK(c.running().nodes == 0);
  CHECK(!follow_for(a, 1500ms, news));
  CHECK(a.running().nodes == 2);
  CHECK(a.running().workers == 4);
}

TEST_CASE(
    "with open rounds a full round takes a late node once another leaves, and fewer "
    "than MIN nodes re-form the world") {
  memory_store s;
  auto rs = open_round_settings(10s);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  node_rendezvous c(s, rs);
  form_round_of_three(a, b, c);

  // The world is at MAX: a fourth node waits as a standby until c leaves.
  node_rendezvous d(s, rs);
  expected<round_result> rd = make_error(errc::internal, "");
  std::thread td([&] { rd = d.next_round(node(1, -1, "d")); });
  REQUIRE(c.leave("stopped by a test"));
  td.join();
  REQUIRE_MESSAGE(rd, rd.error().to_string());
  CHECK(rd->late);
  CHECK(rd->rank_base == 3);

  std::string news;
  CHECK(!follow_for(a, 1500ms, news));
  CHECK(news.find("left round 0: stopped by a test") != std::string::npos);
  CHECK(news.find("arrived in the running round 0") != std::string::npos);

  // b leaves: a and d are still MIN; d leaves too: a alone re-forms.
  REQUIRE(b.leave("stopped by a test"));
  CHECK(!follow_for(a, 1500ms, news));
  REQUIRE(d.leave("stopped by a test"));
  CHECK(follow_for(a, 3s, news));
  CHECK(news.find("only 1 of at least 2 nodes") != std::string::npos);
}

TEST_CASE("with open rounds a silent node is let go, marked gone once for all") {
  memory_store s;
  auto rs = open_round_settings(200ms);
  node_rendezvous a(s, rs);
  node_rendezvous b(s, rs);
  node_rendezvous c(s, rs);
  form_round_of_three(a, b, c);
  // c stops calling should_reform (as if its node died); a and b keep following.
  CHECK(!*c.should_reform());
  std::string news_a;
  std::string news_b;
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < until) {
    REQUIRE(!*a.should_reform());
    REQUIRE(!*b.should_reform());
    for (const auto& line : a.take_news()) news_a += line + "\n";
    for (const auto& line : b.take_news()) news_b += line + "\n";
    std::this_thread::sleep_for(10ms);
  }
  CHECK(news_a.find("(group rank 2) left round 0: silent for") != std::string::npos);
  CHECK(news_b.find("(group rank 2) left round 0: silent for") != std::string::npos);
  CHECK(*s.add("round/0/left", 0, 1s) == 1);
}
