#include <troupe/store/rendezvous.hpp>

#include <array>

#include <troupe/store/detail/kv_table.hpp>

namespace troupe {

namespace {

expected<void> check_rank(std::string_view op, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return make_error(errc::invalid_argument, op, ": rank ", rank, " is not in a world of size ",
                      world_size, "; ranks run from 0 to world_size - 1");
  return ok();
}

// "ranks 2, 5 and 7": which of `keys` (key i belongs to rank i) are absent right now.
expected<std::string> missing_ranks(store& s, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (std::size_t r = 0; r < keys.size(); ++r) {
    std::array<std::string, 1> one{keys[r]};
    auto present = s.check(one, std::chrono::seconds(5));
    if (!present) return std::move(present).error();
    if (!*present) missing.push_back(std::to_string(r));
  }
  std::string out = missing.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < missing.size() && i < 32; ++i) {
    if (i > 0) out += (i + 1 == missing.size()) ? " and " : ", ";
    out += missing[i];
  }
  if (missing.size() > 32) out += strcat(" and ", missing.size() - 32, " more");
  return out;
}

std::vector<std::string> rank_keys(std::string_view prefix, int world_size) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) keys.push_back(strcat(prefix, "/", r));
  return keys;
}

}  // namespace

expected<std::vector<bytes>> all_gather(store& s, std::string_view key_prefix, int rank,
                                        int world_size, std::span<const std::byte> mine,
                                        duration timeout) {
  TROUPE_TRY(check_rank("all_gather", rank, world_size));
  auto until = deadline::after(timeout);
  auto keys = rank_keys(key_prefix, world_size);
  TROUPE_TRY(s.set(keys[static_cast<std::size_t>(rank)], mine, timeout));
  auto waited = s.wait(keys, until.remaining());
  if (!waited) {
    if (waited.error().code() != errc::timeout) return std::move(waited).error();
    auto who = missing_ranks(s, keys);
    if (!who) return std::move(waited).error();
    return make_error(errc::timeout, "all_gather '", key_prefix, "' on ", s.describe(), " (rank ",
                      rank, " of ", world_size, ") timed out after ", format_duration(timeout),
                      ": ", *who, " did not publish a value; check that those processes are alive")
        .with_operation("all_gather");
  }
  std::vector<bytes> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    auto v = s.get(k, until.remaining());
    if (!v) return std::move(v).error();
    out.push_back(std::move(*v));
  }
  return out;
}

expected<void> barrier(store& s, std::string_view name, int rank, int world_size,
                       duration timeout) {
  TROUPE_TRY(check_rank("barrier", rank, world_size));
  auto until = deadline::after(timeout);
  auto arrivals = s.add(strcat(name, "/arrivals"), 1, timeout);
  if (!arrivals) return std::move(arrivals).error();
  std::int64_t generation = (*arrivals - 1) / world_size;
  bool last = (*arrivals - 1) % world_size == world_size - 1;
  std::string gen = strcat(name, "/", generation);
  // Per-rank arrival marks exist only so that a timeout can say who is missing.
  TROUPE_TRY(s.set(strcat(gen, "/", rank), bytes{}, timeout));
  std::string open_key = gen + "/open";
  if (last) {
    TROUPE_TRY(s.set(open_key, to_bytes("1"), timeout));
    // Everyone has left generation - 1 (they all arrived here): clear its keys.
    if (generation > 0) {
      std::string prev = strcat(name, "/", generation - 1);
      for (int r = 0; r < world_size; ++r) (void)s.erase(strcat(prev, "/", r), timeout);
      (void)s.erase(prev + "/open", timeout);
    }
    return ok();
  }
  std::array<std::string, 1> open{open_key};
  auto waited = s.wait(open, until.remaining());
  if (waited || waited.error().code() != errc::timeout) return waited;
  auto who = missing_ranks(s, rank_keys(gen, world_size));
  if (!who) return waited;
  return make_error(errc::timeout, "barrier '", name, "' on ", s.describe(), " (rank ", rank,
                    " of ", world_size, ", round ", generation, ") timed out after ",
                    format_duration(timeout), ": ", *who,
                    " did not arrive; check that those processes are alive and call the "
                    "barrier as often as the others")
      .with_operation("barrier");
}

}  // namespace troupe
