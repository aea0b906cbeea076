#include <troupe/store/membership_token.hpp>

#include <charconv>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include <troupe/core/log.hpp>

namespace troupe {

namespace {

struct record {
  bool held = false;
  std::string nonce;
  std::uint64_t seq = 0;
  duration ttl{0};
  std::string holder;
};

bytes held_record(std::string_view nonce, std::uint64_t seq, duration ttl,
                  std::string_view holder) {
  return to_bytes(strcat("held ", nonce, " ", seq, " ", ttl.count(), " ", holder));
}

bytes free_record(std::string_view nonce) { return to_bytes(strcat("free ", nonce)); }

std::string released_key(std::string_view key, std::string_view nonce) {
  return strcat(key, "/released/", nonce);
}

// Splits off the next space-separated field of `s`.
std::string_view next_field(std::string_view& s) {
  auto sp = s.find(' ');
  std::string_view f = s.substr(0, sp);
  s = sp == std::string_view::npos ? std::string_view() : s.substr(sp + 1);
  return f;
}

template <class Int>
bool parse_int(std::string_view f, Int& out) {
  auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), out);
  return ec == std::errc() && p == f.data() + f.size() && !f.empty();
}

std::optional<record> parse_record(const bytes& value) {
  std::string text = to_string(value);
  std::string_view s = text;
  record r;
  auto tag = next_field(s);
  r.nonce = std::string(next_field(s));
  if (r.nonce.empty()) return std::nullopt;
  if (tag == "free") return s.empty() ? std::optional(r) : std::nullopt;
  if (tag != "held") return std::nullopt;
  r.held = true;
  std::int64_t ttl_ms = 0;
  if (!parse_int(next_field(s), r.seq) || !parse_int(next_field(s), ttl_ms) || ttl_ms <= 0)
    return std::nullopt;
  r.ttl = duration(ttl_ms);
  r.holder = std::string(s);
  return r;
}

std::string fresh_nonce() {
  std::random_device rd;
  std::uint64_t n = (std::uint64_t{rd()} << 32) ^ rd();
  char buf[17];
  auto [end, ec] = std::to_chars(buf, buf + 16, n, 16);
  (void)ec;
  return std::string(buf, end);
}

}  // namespace

struct membership_guard::state {
  state(store& st, std::string k, std::string h, std::string n, bytes rec,
        const membership_token_options& o)
      : s(st),
        key(std::move(k)),
        holder(std::move(h)),
        nonce(std::move(n)),
        current(std::move(rec)),
        options(o) {
    if (options.refresh_interval <= duration::zero())
      options.refresh_interval = std::max(duration(1), options.ttl / 3);
  }

  store& s;
  std::string key;
  std::string holder;
  std::string nonce;
  mutable std::mutex mu;
  std::condition_variable wake;
  bytes current;  // the record last written by this holder
  std::uint64_t seq = 0;
  membership_token_options options;
  bool stopping = false;
  bool released = false;
  bool lost = false;
  std::thread refresher;

  void refresh_loop() {
    std::unique_lock lk(mu);
    while (!stopping) {
      // A timed wait is the refresh schedule; release() interrupts it through `stopping`.
      if (wake.wait_for(lk, options.refresh_interval, [&] { return stopping; })) break;
      bytes from = current;
      std::uint64_t next_seq = seq + 1;
      lk.unlock();
      bytes next = held_record(nonce, next_seq, options.ttl, holder);
      auto now = s.compare_set(key, from, next, options.op_timeout);
      lk.lock();
      if (!now) {
        TROUPE_LOG(log_level::warn, "store", "membership token '", key, "' held by '", holder,
                   "': refresh failed (", now.error().message(),
                   "); waiters take the token over after ", format_duration(options.ttl),
                   " without a refresh");
        continue;
      }
      if (*now == next) {
        current = std::move(next);
        seq = next_seq;
        continue;
      }
      lost = true;
      auto other = parse_record(*now);
      TROUPE_LOG(log_level::warn, "store", "membership token '", key, "' held by '", holder,
                 "' was lost", other && other->held ? " to '" + other->holder + "'" : "",
                 ": a refresh came later than the ttl of ", format_duration(options.ttl),
                 "; the join or leave it protected is no longer exclusive");
      break;
    }
  }

  expected<void> release() {
    {
      std::lock_guard lk(mu);
      if (released) return ok();
      released = true;
      stopping = true;
    }
    wake.notify_all();
    if (refresher.joinable()) refresher.join();
    if (lost) return ok();
    bytes freed = free_record(nonce);
    auto now = s.compare_set(key, current, freed, options.op_timeout);
    if (!now) return std::move(now).error().with_operation("membership_token.release");
    if (*now != freed) {
      TROUPE_LOG(log_level::warn, "store", "membership token '", key, "' held by '", holder,
                 "' had already been taken over when it was released");
      return ok();
    }
    auto marked = s.set(released_key(key, nonce), to_bytes("1"), options.op_timeout);
    if (!marked) return std::move(marked).error().with_operation("membership_token.release");
    return ok();
  }
};

membership_guard::membership_guard(std::unique_ptr<state> s) : state_(std::move(s)) {}
membership_guard::membership_guard(membership_guard&&) noexcept = default;
membership_guard& membership_guard::operator=(membership_guard&& other) noexcept {
  if (this != &other) {
    if (state_) (void)state_->release();
    state_ = std::move(other.state_);
  }
  return *this;
}

membership_guard::~membership_guard() {
  if (!state_) return;
  auto r = state_->release();
  if (!r)
    TROUPE_LOG(log_level::warn, "store", "releasing membership token '", state_->key,
               "' failed: ", r.error().message(), "; waiters take it over after the ttl");
}

bool membership_guard::held() const {
  if (!state_) return false;
  std::lock_guard lk(state_->mu);
  return !state_->released && !state_->lost;
}

expected<void> membership_guard::release() {
  if (!state_) return ok();
  return state_->release();
}

std::string membership_guard::record() const {
  if (!state_) return {};
  std::lock_guard lk(state_->mu);
  return to_string(state_->current);
}

expected<membership_guard> acquire_membership_token(store& s, std::string_view key,
                                                    std::string_view holder, duration timeout,
                                                    const membership_token_options& options) {
  if (options.ttl <= duration::zero())
    return make_error(errc::invalid_argument, "membership token '", key,
                      "': the ttl must be positive");
  auto until = deadline::after(timeout);
  std::string nonce = fresh_nonce();
  bytes mine = held_record(nonce, 0, options.ttl, holder);
  std::optional<bytes> seen;  // the held record we are timing
  clock::time_point seen_at{};

  auto take = [&](std::optional<std::string> previous_nonce) -> expected<membership_guard> {
    if (previous_nonce) (void)s.erase(released_key(key, *previous_nonce), options.op_timeout);
    auto st = std::make_unique<membership_guard::state>(s, std::string(key), std::string(holder),
                                                        nonce, mine, options);
    auto* raw = st.get();
    raw->refresher = std::thread([raw] { raw->refresh_loop(); });
    return membership_guard(std::move(st));
  };

  for (;;) {
    auto now_value = s.compare_set(key, std::nullopt, mine, options.op_timeout);
    if (!now_value) return std::move(now_value).error().with_operation("membership_token.acquire");
    if (*now_value == mine) return take(std::nullopt);
    auto rec = parse_record(*now_value);
    if (!rec)
      return make_error(errc::invalid_argument, "membership token '", key, "' on ", s.describe(),
                        " holds '", to_string(*now_value),
                        "', which is not a token record; give the token a key of its own");
    if (!rec->held) {
      auto swapped = s.compare_set(key, *now_value, mine, options.op_timeout);
      if (!swapped) return std::move(swapped).error().with_operation("membership_token.acquire");
      if (*swapped == mine) return take(rec->nonce);
      continue;  // someone else took it first; look again
    }
    auto now = clock::now();
    if (!seen || *seen != *now_value) {
      seen = *now_value;
      seen_at = now;
    } else if (now - seen_at >= rec->ttl) {
      auto swapped = s.compare_set(key, *now_value, mine, options.op_timeout);
      if (!swapped) return std::move(swapped).error().with_operation("membership_token.acquire");
      if (*swapped == mine) {
        TROUPE_LOG(log_level::warn, "store", "membership token '", key, "': '", holder,
                   "' took it over from '", rec->holder, "', whose record had not changed for ",
                   format_duration(std::chrono::duration_cast<duration>(now - seen_at)));
        return take(rec->nonce);
      }
      continue;
    }
    if (until.expired())
      return make_error(errc::timeout, "could not acquire membership token '", key, "' on ",
                        s.describe(), " within ", format_duration(timeout), ": it is held by '",
                        rec->holder, "' (refreshed ",
                        format_duration(std::chrono::duration_cast<duration>(now - seen_at)),
                        " ago); only one join or leave runs at a time")
          .with_operation("membership_token.acquire");
    // Block until the holder releases, waking for the expiry check and the deadline.
    auto expiry_in = std::chrono::ceil<duration>(seen_at + rec->ttl - now);
    auto nap = std::min(
        {until.remaining(), std::max(rec->ttl / 4, duration(1)), std::max(expiry_in, duration(1))});
    auto released = s.get(released_key(key, rec->nonce), nap);
    if (!released && released.error().code() != errc::timeout)
      return std::move(released).error().with_operation("membership_token.acquire");
  }
}

}  // namespace troupe
