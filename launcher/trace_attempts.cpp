#include <troupe/launcher/trace_attempts.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <troupe/core/settings.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/core/trace.hpp>

namespace troupe::launcher {

trace_attempts::trace_attempts(const std::string& run_id) : run_id_(run_id) {
  auto dir = settings::trace.value();
  if (!dir) {
    trace::start({});  // decided: off
    return;
  }
  dir_ = *dir;
  auto pid = static_cast<std::int64_t>(::getpid());
  trace::process_options o;
  o.dir = dir_;
  o.file_name = strcat("troupe-run-", run_id, "-pid-", pid, ".json");
  // Above every rank, so that the viewers list the launcher last.
  o.pid = 1'000'000 + pid % 1'000'000;
  o.process_name = strcat("troupe-run (pid ", pid, ")");
  on_ = trace::start(o);
}

std::string trace_attempts::worker_dir(int attempt) const {
  if (!on_) return {};
  return strcat(dir_, "/troupe-", run_id_, "-attempt-", attempt);
}

void trace_attempts::merge(int attempt, const std::function<void(const std::string&)>& say) const {
  if (!on_) return;
  trace::flush();
  std::vector<std::string> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(worker_dir(attempt), ec), end; !ec && it != end;
       it.increment(ec))
    if (it->path().extension() == ".json") files.push_back(it->path().string());
  std::sort(files.begin(), files.end());
  // troupe-run shares its clock with its workers: it takes the offset of the first one that
  // measured it (rank 0's clock is the reference).
  std::int64_t offset = 0;
  for (const auto& f : files)
    if (auto o = trace::recorded_offset(f)) {
      offset = *o;
      break;
    }
  std::vector<std::string> inputs = files;
  std::vector<std::string> own{trace::file_path()};
  const auto out = strcat(dir_, "/troupe-trace-", run_id_, "-attempt-", attempt, ".json");
  // troupe-run's own file goes in with its local workers' offset.
  auto workers = trace::merge_files(inputs, out + ".workers");
  if (!workers) {
    say(strcat("trace: cannot merge attempt ", attempt, ": ", workers.error().message()));
    return;
  }
  auto launcher_part = trace::merge_files(own, out + ".launcher", offset);
  if (!launcher_part) {
    say(strcat("trace: cannot merge attempt ", attempt, ": ", launcher_part.error().message()));
    return;
  }
  auto all = trace::merge_files({out + ".workers", out + ".launcher"}, out);
  std::filesystem::remove(out + ".workers", ec);
  std::filesystem::remove(out + ".launcher", ec);
  if (!all) {
    say(strcat("trace: cannot merge attempt ", attempt, ": ", all.error().message()));
    return;
  }
  say(strcat("trace of attempt ", attempt, " (", files.size(), " worker files, ", all->events,
             " events): ", out));
}

}  // namespace troupe::launcher
