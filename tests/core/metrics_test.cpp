// The metrics registry: counters, gauges and histograms, the snapshot's line format, and
// Prometheus' text format.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <troupe/core/metrics.hpp>

using namespace troupe;

namespace {

const metrics::sample* find(const std::vector<metrics::sample>& all, const std::string& name) {
  for (const auto& s : all)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

TEST_CASE("a counter updated from several threads counts every addition") {
  auto& c = metrics::get_counter("test_threads_total", "additions from threads");
  const auto before = c.value();
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&c] {
      for (int k = 0; k < 10000; ++k) c.add();
    });
  for (auto& t : ts) t.join();
  CHECK(c.value() == before + 40000);
  CHECK(&metrics::get_counter("test_threads_total", "again") == &c);  // one metric per name
}

TEST_CASE("a histogram counts each observation into the first bucket that holds it") {
  const double bounds[] = {1, 2, 4};
  auto& h = metrics::get_histogram("test_buckets", "observations", bounds);
  for (double v : {0.5, 1.0, 1.5, 3.0, 100.0}) h.observe(v);
  CHECK(h.bucket(0) == 2);  // 0.5 and 1.0 (a bound is inclusive)
  CHECK(h.bucket(1) == 1);
  CHECK(h.bucket(2) == 1);
  CHECK(h.bucket(3) == 1);  // +Inf
  CHECK(h.sum() == doctest::Approx(106.0));
  auto snap = metrics::snapshot();
  const auto* s = find(snap, "test_buckets");
  REQUIRE(s != nullptr);
  CHECK(s->cumulative == std::vector<std::uint64_t>{2, 3, 4, 5});
}

TEST_CASE("a snapshot survives its line format with labels, help and histograms intact") {
  metrics::get_counter("test_encoded_total", "a counter with labels", {{"op", "allreduce"}}).add(7);
  metrics::get_gauge("test_depth", "a gauge").set(-3);
  metrics::get_histogram("test_latency_seconds", "latency", metrics::latency_buckets())
      .observe(std::chrono::microseconds(300));
  auto snap = metrics::snapshot();
  auto back = metrics::decode_snapshot(metrics::encode_snapshot(snap));
  REQUIRE(back);
  REQUIRE(back->size() == snap.size());
  for (std::size_t i = 0; i < snap.size(); ++i) {
    CHECK((*back)[i].name == snap[i].name);
    CHECK((*back)[i].help == snap[i].help);
    CHECK((*back)[i].kind == snap[i].kind);
    CHECK((*back)[i].label_set == snap[i].label_set);
    CHECK((*back)[i].value == snap[i].value);
    CHECK((*back)[i].bounds == snap[i].bounds);
    CHECK((*back)[i].cumulative == snap[i].cumulative);
  }
  const auto* g = find(*back, "test_depth");
  REQUIRE(g != nullptr);
  CHECK(g->value == -3);
}

TEST_CASE("a malformed snapshot is refused naming its line") {
  auto r = metrics::decode_snapshot("troupe-metrics 1\nc name_total - 1\nx what\n");
  REQUIRE(!r);
  CHECK(r.error().code() == errc::protocol_error);
  CHECK(r.error().message().find("line 3") != std::string::npos);
  CHECK(!metrics::decode_snapshot("something else\n"));
}

TEST_CASE("the Prometheus text has one HELP and TYPE per name and histogram series") {
  metrics::sample a;
  a.name = "x_total";
  a.help = "things";
  a.label_set = {{"rank", "0"}};
  a.value = 3;
  metrics::sample b = a;
  b.label_set = {{"rank", "1"}};
  b.value = 4;
  metrics::sample h;
  h.name = "y_seconds";
  h.help = "time";
  h.kind = metrics::kind::histogram;
  h.bounds = {0.5};
  h.cumulative = {1, 2};
  h.sum = 1.25;
  const auto text = metrics::prometheus_text({a, h, b});
  CHECK(text ==
        "# HELP x_total things\n# TYPE x_total counter\n"
        "x_total{rank=\"0\"} 3\nx_total{rank=\"1\"} 4\n"
        "# HELP y_seconds time\n# TYPE y_seconds histogram\n"
        "y_seconds_bucket{le=\"0.5\"} 1\ny_seconds_bucket{le=\"+Inf\"} 2\n"
        "y_seconds_sum 1.25\ny_seconds_count 2\n");
}

TEST_CASE("size classes name the smallest class that holds a size") {
  CHECK(metrics::size_class(0) == "1KiB");
  CHECK(metrics::size_class(1024) == "1KiB");
  CHECK(metrics::size_class(1025) == "16KiB");
  CHECK(metrics::size_class(4u << 20) == "4MiB");
  CHECK(metrics::size_class(1u << 30) == "large");
}

TEST_CASE("the exporter rewrites its file with fresh snapshots until the process exits") {
  const auto path = std::filesystem::temp_directory_path() /
                    ("troupe-metrics-test-" + std::to_string(::getpid()));
  // Registered before the exporter's own handler, so it runs after the last snapshot.
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove(std::filesystem::temp_directory_path() /
                                ("troupe-metrics-test-" + std::to_string(::getpid())),
                            ignored);
  });
  auto& c = metrics::get_counter("test_exported_total", "counted while exporting");
  c.add(1);
  metrics::start_export(path.string(), std::chrono::milliseconds(20));
  c.add(41);
  const auto read_value = [&]() -> double {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto snap = metrics::decode_snapshot(ss.str());
    if (!snap) return -1;
    const auto* s = find(*snap, "test_exported_total");
    return s == nullptr ? -1 : s->value;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double seen = -1;
  while ((seen = read_value()) < 42 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(seen == 42);
}
