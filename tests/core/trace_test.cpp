#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <troupe/core/trace.hpp>

using namespace troupe;

namespace {

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE(
    "the merge shifts each per-process file by its own clock offset and keeps merged files as they "
    "are") {
  auto dir = temp_dir("troupe-trace-merge");
  // Rank 1's clock runs 2 ms ahead of rank 0's; its last line was cut off by a kill.
  write(dir + "/r0.json",
        "[\n{\"ph\":\"M\",\"ts\":0.000,\"pid\":0,\"tid\":0,\"name\":\"troupe_clock\",\"args\":{"
        "\"offset_ns\":0,"
        "\"uncertainty_ns\":0,\"how\":\"reference\"}},\n"
        "{\"ph\":\"X\",\"ts\":100.000,\"pid\":0,\"tid\":7,\"dur\":50.000,\"cat\":\"rpc\",\"name\":"
        "\"call f\",\"args\":{}},\n");
  write(dir + "/r1.json",
        "[\n{\"ph\":\"M\",\"ts\":0.000,\"pid\":1,\"tid\":0,\"name\":\"troupe_clock\",\"args\":{"
        "\"offset_ns\":2000000,"
        "\"uncertainty_ns\":1500,\"how\":\"ping\"}},\n"
        "{\"ph\":\"X\",\"ts\":2110.500,\"pid\":1,\"tid\":8,\"dur\":20.000,\"cat\":\"rpc\",\"name\":"
        "\"serve f\",\"args\":{}},\n"
        "{\"ph\":\"X\",\"ts\":2200.0");
  CHECK(*trace::recorded_offset(dir + "/r1.json") == 2000000);
  auto r = trace::merge_files({dir + "/r0.json", dir + "/r1.json"}, dir + "/merged.json");
  REQUIRE(r);
  CHECK(r->files == 2);
  CHECK(r->events == 4);
  auto merged = read(dir + "/merged.json");
  CHECK(merged.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(merged.find("\"ts\":100.000,\"pid\":0") != std::string::npos);
  CHECK(merged.find("\"ts\":110.500,\"pid\":1") != std::string::npos);
  CHECK(merged.find("\"ts\":2200.0") == std::string::npos);  // the cut line is dropped
  CHECK(merged.find("\"name\":\"troupe_clock_applied\"") != std::string::npos);
  CHECK(merged.find("\"name\":\"troupe_clock\",") == std::string::npos);
  // Merging the merged file again (the multi-node case) shifts nothing twice.
  auto again = trace::merge_files({dir + "/merged.json"}, dir + "/again.json", 999000);
  REQUIRE(again);
  CHECK(again->events == 4);
  CHECK(read(dir + "/again.json").find("\"ts\":110.500,\"pid\":1") != std::string::npos);
  // A file without an offset takes the default.
  write(dir + "/none.json",
        "[\n{\"ph\":\"i\",\"ts\":5000.000,\"pid\":9,\"tid\":1,\"s\":\"p\",\"name\":\"spawn\","
        "\"args\":{}},\n");
  REQUIRE(trace::merge_files({dir + "/none.json"}, dir + "/none-merged.json", 1000000));
  CHECK(read(dir + "/none-merged.json").find("\"ts\":4000.000") != std::string::npos);
  CHECK(!trace::merge_files({dir + "/missing.json"}, dir + "/x.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a traced process writes spans, flows and its clock offset, one event per line") {
  auto dir = temp_dir("troupe-trace-recorder");
  trace::process_options o;
  o.dir = dir + "/sub";
  o.file_name = "p.json";
  o.pid = 3;
  o.process_name = "rank 3";
  if constexpr (!trace::sites) {
    // A build without trace sites (TROUPE_TRACE_SITES=OFF) refuses, records nothing and
    // creates no file.
    CHECK(!trace::start(o));
    CHECK(!trace::enabled());
    trace::complete("rpc", "call f", 1, 2);
    trace::flush();
    CHECK(trace::file_path().empty());
    CHECK(!std::filesystem::exists(dir + "/sub/p.json"));
    std::filesystem::remove_all(dir);
    return;
  }
  REQUIRE(trace::start(o));
  CHECK(trace::enabled());
  CHECK(trace::file_path() == dir + "/sub/p.json");
  trace::complete("rpc", "call \"f\"", 1'000'000, 1'250'500,
                  trace::args().add("peer", "w1").add("bytes", 12), {42, 0});
  {
    trace::span s("collectives", "allreduce");
    s.args().add("seq", std::uint64_t{7});
  }
  trace::instant("launcher", "spawn", trace::args().add("rank", 3));
  trace::set_clock(-1500, 20, "test");
  trace::flush();
  auto text = read(trace::file_path());
  CHECK(text.rfind("[\n", 0) == 0);
  CHECK(text.find("{\"ph\":\"X\",\"ts\":1000.000,\"pid\":3,") != std::string::npos);
  CHECK(text.find("\"dur\":250.500,\"cat\":\"rpc\",\"name\":\"call "
                  "\\\"f\\\"\",\"args\":{\"peer\":\"w1\",\"bytes\":12}") != std::string::npos);
  CHECK(text.find("{\"ph\":\"s\",\"ts\":1000.000,\"pid\":3,") != std::string::npos);
  CHECK(text.find("\"id\":42,") != std::string::npos);
  CHECK(text.find("\"name\":\"allreduce\",\"args\":{\"seq\":7}") != std::string::npos);
  CHECK(text.find("\"name\":\"process_name\",\"args\":{\"name\":\"rank 3\"}") != std::string::npos);
  CHECK(*trace::recorded_offset(trace::file_path()) == -1500);
  // A second start changes nothing.
  o.file_name = "other.json";
  CHECK(trace::start(o));
  CHECK(trace::file_path() == dir + "/sub/p.json");
  std::filesystem::remove_all(dir);
}
