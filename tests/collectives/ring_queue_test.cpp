#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <troupe/collectives/gloo/ring_queue.hpp>

using troupe::collectives::gloo_runner::ring_queue;

TEST_CASE("a ring queue keeps its order across wrap-arounds and growth") {
  ring_queue<std::unique_ptr<int>> q;
  CHECK(q.empty());
  int next_in = 0, next_out = 0;
  // Push more than it has room for while popping, so that the ring wraps, then grows with
  // its elements split across the end of the ring.
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 3 + round % 7; ++k) q.push_back(std::make_unique<int>(next_in++));
    for (int k = 0; k < 2 + round % 5 && !q.empty(); ++k) {
      CHECK(*q.front() == next_out++);
      q.pop_front();
    }
    std::vector<int> seen;
    for (auto& v : q) seen.push_back(*v);
    REQUIRE(seen.size() == q.size());
    for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == next_out + static_cast<int>(i));
  }
  ring_queue<std::unique_ptr<int>> other;
  other.swap(q);
  CHECK(q.empty());
  while (!other.empty()) {
    CHECK(*other.front() == next_out++);
    other.pop_front();
  }
  CHECK(next_out == next_in);
}

TEST_CASE("a ring queue releases what it pops") {
  auto shared = std::make_shared<int>(1);
  ring_queue<std::shared_ptr<int>> q;
  q.push_back(std::shared_ptr<int>(shared));
  CHECK(shared.use_count() == 2);
  q.pop_front();
  CHECK(shared.use_count() == 1);
}
