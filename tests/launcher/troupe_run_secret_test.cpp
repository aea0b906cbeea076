// The job secret troupe-run gives its job: a fresh one per run unless the user hands one
// in, required by the job's store, passed to the workers. Each test runs the real binary
// and probes its store as another process would.
#include <cstdlib>

#include <troupe/store/tcp_store.hpp>
#include "process_helpers.hpp"

using namespace launcher_test;

namespace {

const std::string troupe_run = TROUPE_RUN_BINARY;
const std::string worker = TROUPE_LAUNCHER_TEST_WORKER;

std::vector<std::string> standalone(const fs::path& dir, std::vector<std::string> extra,
                                    const std::string& mode) {
  std::vector<std::string> args{
      troupe_run, "--standalone", "--log-dir", (dir / "logs").string(), "--stop-grace", "2s"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {worker, mode, dir.string()});
  return args;
}

// What the store at `url` ("tcp://host:port") says to a client holding `secret`.
troupe::expected<std::unique_ptr<troupe::tcp_store>> knock(const std::string& url,
                                                           const std::string& secret) {
  auto hp = url.substr(url.find("://") + 3);
  troupe::tcp_store_options o;
  o.host = hp.substr(0, hp.rfind(':'));
  o.port = static_cast<std::uint16_t>(std::stoi(hp.substr(hp.rfind(':') + 1)));
  o.secret = secret;
  o.local_socket = false;
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(5);
  return troupe::tcp_store::connect(o);
}

// Runs a one-worker job that waits, returns its record, and lets it finish.
record record_of_waiting_job(const fs::path& dir, std::vector<std::string> extra,
                             const std::function<void(const record&)>& while_running = {}) {
  auto p = start(standalone(dir, std::move(extra), "wait"), dir / "out.txt");
  record r;
  if (!eventually([&] { return records_of_round(dir, 0).size() == 1; })) {
    FAIL_CHECK("the worker never started: " << p->text());
    return r;
  }
  r = records_of_round(dir, 0).at(0);
  if (while_running) while_running(r);
  std::ofstream(dir / "stop").put('\n');
  CHECK(p->wait(20s));
  CHECK(p->exit_code() == 0);
  return r;
}

}  // namespace

TEST_CASE("a job of one node gets a fresh secret that its store requires of every client") {
  ::unsetenv("TROUPE_JOB_SECRET");
  ::unsetenv("TROUPE_STORE_SECRET");
  auto dir = fresh_dir("secret-fresh");
  auto first = record_of_waiting_job(dir, {}, [](const record& r) {
    REQUIRE(r.at("TROUPE_STORE_URL").starts_with("tcp://"));
    CHECK(r.at("TROUPE_JOB_SECRET").size() == 64);
    // The workers' secret opens the store; none, or another job's, is refused.
    CHECK(knock(r.at("TROUPE_STORE_URL"), r.at("TROUPE_JOB_SECRET")).has_value());
    auto none = knock(r.at("TROUPE_STORE_URL"), "");
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == troupe::errc::unauthorized);
    auto other = knock(r.at("TROUPE_STORE_URL"), std::string(64, 'a'));
    REQUIRE_FALSE(other);
    CHECK(other.error().code() == troupe::errc::unauthorized);
  });
  auto dir2 = fresh_dir("secret-fresh-again");
  auto second = record_of_waiting_job(dir2, {});
  CHECK(second.at("TROUPE_JOB_SECRET").size() == 64);
  CHECK(second.at("TROUPE_JOB_SECRET") != first.at("TROUPE_JOB_SECRET"));
}

TEST_CASE("--secret-file's secret, or TROUPE_JOB_SECRET, is the job's and reaches the workers") {
  auto dir = fresh_dir("secret-file");
  { std::ofstream(dir / "secret") << "  s3cret-from-file\n"; }
  auto r = record_of_waiting_job(dir, {"--secret-file", (dir / "secret").string()},
                                 [](const record& rec) {
                                   CHECK(knock(rec.at("TROUPE_STORE_URL"), "s3cret-from-file"));
                                   CHECK_FALSE(knock(rec.at("TROUPE_STORE_URL"), ""));
                                 });
  CHECK(r.at("TROUPE_JOB_SECRET") == "s3cret-from-file");

  auto dir2 = fresh_dir("secret-env");
  ::setenv("TROUPE_JOB_SECRET", "s3cret-from-env", 1);
  auto r2 = record_of_waiting_job(dir2, {});
  ::unsetenv("TROUPE_JOB_SECRET");
  CHECK(r2.at("TROUPE_JOB_SECRET") == "s3cret-from-env");
}

TEST_CASE("a secret file that is missing or empty is refused before anything starts") {
  auto dir = fresh_dir("secret-bad");
  auto p =
      start(standalone(dir, {"--secret-file", (dir / "nope").string()}, "env"), dir / "out.txt");
  REQUIRE(p->wait(20s));
  CHECK(p->exit_code() == 2);
  CHECK(p->text().find("--secret-file: cannot read the secret file") != std::string::npos);
  std::ofstream(dir / "empty").put('\n');
  auto q =
      start(standalone(dir, {"--secret-file", (dir / "empty").string()}, "env"), dir / "out2.txt");
  REQUIRE(q->wait(20s));
  CHECK(q->exit_code() == 2);
  CHECK(q->text().find("is empty") != std::string::npos);
  CHECK(records_of_round(dir, 0).empty());
}
