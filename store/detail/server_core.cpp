#include <troupe/store/detail/server_core.hpp>

#include <algorithm>

#include <troupe/store/detail/wire.hpp>

namespace troupe::detail {

bool server_core::park(const std::shared_ptr<parked_request>& w) {
  for (const auto& k : w->keys) {
    if (!table.contains(k)) {
      w->parked_on = k;
      parked[k].push_back(w);
      return true;
    }
  }
  return false;
}

void server_core::wake(const std::string& key, std::vector<wake_reply>& out) {
  auto it = parked.find(key);
  if (it == parked.end() || !table.contains(key)) return;
  auto list = std::move(it->second);
  parked.erase(it);
  for (auto& w : list) {
    if (park(w)) continue;
    waiters.erase({w->owner, w->id});
    auto conn = w->conn.lock();
    if (!conn) continue;
    if (w->is_get) {
      const bytes* v = table.find(w->keys.front());
      out.push_back(
          {std::move(conn),
           wire::encode_reply_ok(w->id, v->size() + 4, [&](byte_writer& wr) { wr.blob(*v); })});
    } else {
      out.push_back({std::move(conn), wire::encode_reply_ok(w->id, 0, [](byte_writer&) {})});
    }
  }
}

void server_core::unpark(const std::shared_ptr<parked_request>& w) {
  auto it = parked.find(w->parked_on);
  if (it == parked.end()) return;
  std::erase(it->second, w);
  if (it->second.empty()) parked.erase(it);
}

void server_core::cancel(const server_connection* c, std::uint64_t id) {
  std::lock_guard lk(mu);
  auto it = waiters.find({c, id});
  if (it == waiters.end()) return;
  unpark(it->second);
  waiters.erase(it);
}

void server_core::forget_connection(const server_connection* c) {
  std::lock_guard lk(mu);
  auto it = waiters.lower_bound({c, 0});
  while (it != waiters.end() && it->first.first == c) {
    unpark(it->second);
    it = waiters.erase(it);
  }
  connections.erase(c);
}

}  // namespace troupe::detail
