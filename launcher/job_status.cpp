#include <troupe/launcher/job_status.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <troupe/core/strcat.hpp>

namespace troupe::launcher {

int job_status::running() const {
  return static_cast<int>(std::count_if(
      workers.begin(), workers.end(), [](const worker_status& w) { return w.state == "running"; }));
}

std::string status_json(const job_status& s) {
  nlohmann::json j;
  j["run_id"] = s.run_id;
  j["host"] = s.host;
  j["address"] = s.address;
  j["state"] = s.state;
  j["round"] = s.round;
  j["attempt"] = s.attempt;
  j["rounds"] = s.rounds;
  j["restarts"] = s.restarts;
  j["max_restarts"] = s.max_restarts;
  j["world_size"] = s.world_size;
  j["nodes"] = s.nodes;
  j["workers_running"] = s.running();
  j["workers"] = nlohmann::json::array();
  for (const auto& w : s.workers) {
    j["workers"].push_back({{"rank", w.rank},
                            {"local_rank", w.local_rank},
                            {"host", s.host},
                            {"pid", w.pid},
                            {"state", w.state},
                            {"restarts", w.restarts},
                            {"logs", w.log_dir}});
  }
  return j.dump(2) + "\n";
}

expected<job_status> parse_status_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::protocol_error, "the status is not a JSON object");
  try {
    job_status s;
    s.run_id = j.at("run_id").get<std::string>();
    s.host = j.at("host").get<std::string>();
    s.address = j.value("address", std::string());
    s.state = j.at("state").get<std::string>();
    s.round = j.at("round").get<long>();
    s.attempt = j.at("attempt").get<int>();
    s.rounds = j.at("rounds").get<long>();
    s.restarts = j.at("restarts").get<int>();
    s.max_restarts = j.at("max_restarts").get<int>();
    s.world_size = j.at("world_size").get<int>();
    s.nodes = j.at("nodes").get<int>();
    for (const auto& w : j.at("workers")) {
      worker_status ws;
      ws.rank = w.at("rank").get<int>();
      ws.local_rank = w.at("local_rank").get<int>();
      ws.pid = w.at("pid").get<long>();
      ws.state = w.at("state").get<std::string>();
      ws.restarts = w.at("restarts").get<int>();
      ws.log_dir = w.at("logs").get<std::string>();
      s.workers.push_back(std::move(ws));
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::protocol_error,
                      "the status lacks a field or has a wrong type: ", e.what());
  }
}

std::string status_table(const job_status& s) {
  std::string out =
      strcat("run ", s.run_id, " on ", s.host, " (", s.address, "): ", s.state, ", round ", s.round,
             ", attempt ", s.attempt, ", restarts ", s.restarts, "/", s.max_restarts, ", ",
             s.running(), "/", s.workers.size(), " workers running, world size ", s.world_size,
             " on ", s.nodes, s.nodes == 1 ? " node\n" : " nodes\n");
  std::vector<std::vector<std::string>> rows{
      {"RANK", "LOCAL", "HOST", "PID", "STATE", "RESTARTS", "LOGS"}};
  for (const auto& w : s.workers)
    rows.push_back({std::to_string(w.rank), std::to_string(w.local_rank), s.host,
                    std::to_string(w.pid), w.state, std::to_string(w.restarts), w.log_dir});
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace troupe::launcher
