// Why this file is long (~620 lines): every store operation maps to etcd transactions over
// one key layout and one lease; keeping them together keeps that layout in one place.
// etcd_store on top of etcd_http: key layout, the lease and its keep-alive thread,
// transactions for add/compare_set, and watches for get/wait.
#include <troupe/store/etcd_store.hpp>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <troupe/core/log.hpp>
#include <troupe/store/detail/kv_table.hpp>
#include <troupe/store/etcd_http.hpp>

namespace troupe {

using detail::base64_decode;
using detail::base64_encode;
using detail::json;
using detail::json_int;

namespace {

// etcd refuses transactions with more operations than --max-txn-ops (128 by default).
constexpr std::size_t max_txn_ops = 128;

std::string text_of(std::span<const std::byte> value) {
  return std::string(reinterpret_cast<const char*>(value.data()), value.size());
}

// The smallest key greater than every key that starts with `prefix` ("\0" = no end).
std::string range_end_of(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// One key as a range/txn reply describes it.
struct kv_state {
  bool found = false;
  std::string value;
  std::int64_t mod_revision = 0;
};

expected<kv_state> kv_from_range(const json& range_reply) {
  kv_state out;
  auto it = range_reply.find("kvs");
  if (it == range_reply.end() || !it->is_array() || it->empty()) return out;
  const json& kv = (*it)[0];
  auto value = base64_decode(kv.value("value", std::string{}));
  if (!value) return std::move(value).error();
  out.found = true;
  out.value = std::move(*value);
  out.mod_revision = json_int(kv, "mod_revision");
  return out;
}

}  // namespace

struct etcd_store::impl {
  impl(etcd_store_options o, std::vector<detail::etcd_endpoint> eps)
      : options(std::move(o)), http(std::move(eps)) {}

  etcd_store_options options;
  detail::etcd_http http;
  std::string prefix;
  std::int64_t lease = 0;

  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;        // the keep-alive thread should exit
  bool closed = false;          // close() ran
  bool revoke_on_close = true;  // false once the lease was abandoned or lost
  std::optional<error> sticky;  // the lease is gone: every call fails with this
  std::thread keepalive;

  std::string full(std::string_view key) const { return prefix + std::string(key); }
  std::string b64(std::string_view key) const { return base64_encode(full(key)); }

  // A put of `key`, attached to the lease when there is one.
  json put_request(std::string_view key, std::string_view value) const {
    json put = {{"key", b64(key)}, {"value", base64_encode(value)}};
    if (lease != 0) put["lease"] = std::to_string(lease);
    return put;
  }

  std::string describe() const {
    return strcat("etcd_store ", http.describe(), " prefix '", prefix, "'");
  }

  expected<void> usable() {
    std::lock_guard lock(mu);
    if (closed) return make_error(errc::shut_down, describe(), " is closed");
    if (sticky) return *sticky;
    return ok();
  }

  // A call failed: attach the store and operation.
  error annotate(error e, std::string_view op) const {
    return std::move(e).with_operation(strcat("store.", op));
  }

  expected<json> post(std::string_view path, const json& body, deadline until, bool retry_safe) {
    return http.post(path, body, until, {.retry_safe = retry_safe, .ignore_cancel = false});
  }

  expected<kv_state> read(std::string_view key, deadline until, std::int64_t* revision) {
    auto reply = post("/v3/kv/range", {{"key", b64(key)}}, until, true);
    if (!reply) return std::move(reply).error();
    if (revision) *revision = json_int((*reply)["header"], "revision");
    return kv_from_range(*reply);
  }

  // Which of `keys` exist, read at one revision (returned through `revision`).
  expected<std::vector<bool>> presence(std::span<const std::string> keys, deadline until,
                                       std::int64_t* revision) {
    std::vector<bool> present(keys.size(), false);
    if (keys.size() <= max_txn_ops) {
      json ops = json::array();
      for (const auto& k : keys)
        ops.push_back({{"request_range", {{"key", b64(k)}, {"count_only", true}}}});
      auto reply = post("/v3/kv/txn", {{"success", ops}}, until, true);
      if (!reply) return std::move(reply).error();
      *revision = json_int((*reply)["header"], "revision");
      const json& responses = (*reply)["responses"];
      for (std::size_t i = 0; i < keys.size() && i < responses.size(); ++i)
        present[i] = json_int(responses[i]["response_range"], "count") > 0;
      return present;
    }
    // Many keys: one keys-only range over their span, still a single revision.
    auto [lo, hi] = std::minmax_element(keys.begin(), keys.end());
    auto reply = post("/v3/kv/range",
                      {{"key", b64(*lo)},
                       {"range_end", base64_encode(full(*hi) + std::string(1, '\0'))},
                       {"keys_only", true}},
                      until, true);
    if (!reply) return std::move(reply).error();
    *revision = json_int((*reply)["header"], "revision");
    std::map<std::string, bool, std::less<>> seen;
    for (const auto& kv : reply->value("kvs", json::array())) {
      auto k = base64_decode(kv.value("key", std::string{}));
      if (!k) return std::move(k).error();
      seen[*k] = true;
    }
    for (std::size_t i = 0; i < keys.size(); ++i) present[i] = seen.contains(full(keys[i]));
    return present;
  }

  // Opens a watch on [key, range_end) (range_end empty: just key) from `start_revision`.
  expected<std::unique_ptr<detail::etcd_stream>> watch(const std::string& full_key,
                                                       const std::string& range_end,
                                                       std::int64_t start_revision,
                                                       deadline until) {
    json create = {{"key", base64_encode(full_key)},
                   {"start_revision", std::to_string(start_revision)}};
    if (!range_end.empty()) create["range_end"] = base64_encode(range_end);
    return http.open_stream("/v3/watch", {{"create_request", create}}, until);
  }

  void keepalive_loop();
  void close();
};

// ---------------------------------------------------------------------------------------
// Watches.

namespace {

// One decoded watch event.
struct watch_event {
  bool deleted = false;
  std::string key;  // full key
  std::string value;
};

// What one watch message says: events, or that the watch ended.
struct watch_message {
  std::vector<watch_event> events;
  bool compacted = false;  // start revision compacted away: read again and re-watch
};

expected<watch_message> decode_watch(const json& message, std::string_view where) {
  if (auto e = message.find("error"); e != message.end()) {
    std::string text = e->is_object() ? e->value("message", e->dump()) : e->dump();
    return make_error(errc::connection_lost, "etcd ended the watch on ", where, ": ", text);
  }
  watch_message out;
  auto r = message.find("result");
  if (r == message.end() || !r->is_object()) return out;
  if (r->value("canceled", false)) {
    if (json_int(*r, "compact_revision") > 0) {
      out.compacted = true;
      return out;
    }
    return make_error(errc::connection_lost, "etcd cancelled the watch on ", where, ": ",
                      r->value("cancel_reason", std::string("no reason given")));
  }
  for (const auto& ev : r->value("events", json::array())) {
    watch_event w;
    // PUT events omit "type" (proto3 leaves out the zero enum value).
    w.deleted = ev.value("type", std::string("PUT")) == "DELETE";
    const json& kv = ev.contains("kv") ? ev["kv"] : json::object();
    auto k = base64_decode(kv.value("key", std::string{}));
    if (!k) return std::move(k).error();
    w.key = std::move(*k);
    if (!w.deleted) {
      auto v = base64_decode(kv.value("value", std::string{}));
      if (!v) return std::move(v).error();
      w.value = std::move(*v);
    }
    out.events.push_back(std::move(w));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The lease.

void etcd_store::impl::keepalive_loop() {
  // Renew three times per TTL, so that one or two lost renewals do not lose the lease.
  const duration interval = std::max(duration(200), duration(options.lease_ttl.count() / 3));
  auto last_renewed = clock::now();
  std::unique_lock lock(mu);
  while (!stopping) {
    wake.wait_for(lock, interval, [&] { return stopping; });
    if (stopping) break;
    lock.unlock();
    auto reply = http.post("/v3/lease/keepalive", {{"ID", std::to_string(lease)}},
                           deadline::after(interval), {.retry_safe = true});
    std::optional<error> lost;
    if (reply) {
      const json& result = reply->contains("result") ? (*reply)["result"] : *reply;
      if (json_int(result, "TTL") <= 0)
        lost = make_error(errc::connection_lost, "the lease of ", describe(),
                          " expired, so etcd deleted the keys this participant wrote; it "
                          "was not renewed within ",
                          format_duration(options.lease_ttl),
                          " (etcd unreachable or this process stalled)");
      else
        last_renewed = clock::now();
    } else if (reply.error().code() == errc::shut_down) {
      lock.lock();
      break;
    } else {
      TROUPE_LOG(log_level::warn, "store", "renewing the lease of ", describe(),
                 " failed: ", reply.error().message());
      if (clock::now() - last_renewed > options.lease_ttl)
        lost = make_error(
            errc::connection_lost, "the lease of ", describe(),
            " could not be renewed for longer than its TTL of ", format_duration(options.lease_ttl),
            ", so etcd has deleted this participant's keys; last error: ", reply.error().message());
    }
    lock.lock();
    if (lost) {
      TROUPE_LOG(log_level::error, "store", lost->message());
      sticky = std::move(*lost);
      revoke_on_close = false;
      break;
    }
  }
}

void etcd_store::impl::close() {
  bool revoke = false;
  {
    std::lock_guard lock(mu);
    if (closed) return;
    closed = true;
    stopping = true;
    revoke = revoke_on_close;
  }
  wake.notify_all();
  http.cancel_all();
  if (keepalive.joinable()) keepalive.join();
  {
    std::lock_guard lock(mu);
    revoke = revoke && revoke_on_close;
  }
  if (!revoke) return;
  auto reply = http.post("/v3/lease/revoke", {{"ID", std::to_string(lease)}},
                         deadline::after(options.close_timeout), {.ignore_cancel = true});
  if (!reply && reply.error().code() != errc::not_found)
    TROUPE_LOG(log_level::warn, "store", "revoking the lease of ", describe(),
               " failed; its keys expire after ", format_duration(options.lease_ttl), ": ",
               reply.error().message());
}

// ---------------------------------------------------------------------------------------
// Construction.

expected<std::unique_ptr<etcd_store>> etcd_store::connect(const etcd_store_options& options) {
  if (options.endpoints.empty())
    return make_error(errc::invalid_argument, "etcd_store needs at least one endpoint");
  std::vector<detail::etcd_endpoint> eps;
  for (const auto& text : options.endpoints) {
    auto ep = detail::parse_etcd_endpoint(text);
    if (!ep) return std::move(ep).error();
    eps.push_back(std::move(*ep));
  }
  if (options.lease_ttl < std::chrono::seconds(1))
    return make_error(errc::invalid_argument, "etcd_store lease_ttl is ",
                      format_duration(options.lease_ttl),
                      "; etcd leases last whole seconds, "
                      "give at least 2s");
  if (options.timeout <= duration::zero() || options.close_timeout <= duration::zero())
    return make_error(errc::invalid_argument, "etcd_store timeouts must be positive");

  auto state = std::make_shared<impl>(options, std::move(eps));
  detail::etcd_http_security security;
  security.tls = options.tls.enabled;
  security.ca_file = options.tls.ca_file;
  security.cert_file = options.tls.cert_file;
  security.key_file = options.tls.key_file;
  security.user = options.user;
  security.password = options.password;
  if (auto r = state->http.secure(std::move(security)); !r)
    return std::move(r).error().with_operation("store.connect");
  state->prefix = options.prefix;
  if (!state->prefix.empty() && state->prefix.back() != '/') state->prefix += '/';

  // etcd may still be starting (a job launched together with it): a refused connection is
  // retried with backoff until the connect timeout, then reported with every endpoint's
  // reason.
  const deadline connect_until = deadline::after(options.timeout);
  auto retrying = [&](auto call) {
    auto pause = std::chrono::milliseconds(20);
    for (;;) {
      auto r = call();
      if (r || r.error().code() != errc::connection_lost || connect_until.expired()) return r;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(connect_until.remaining());
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(pause, left));
      pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::milliseconds(500));
      if (connect_until.expired()) return r;
    }
  };

  const auto ttl_s = std::chrono::ceil<std::chrono::seconds>(options.lease_ttl).count();
  if (options.attach_lease) {
    // A retried grant that had in fact succeeded leaves a lease that lapses after its TTL.
    auto grant = retrying([&] {
      return state->http.post("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}, connect_until);
    });
    if (!grant) return std::move(grant).error().with_operation("store.connect");
    state->lease = json_int(*grant, "ID");
    if (state->lease == 0)
      return make_error(errc::protocol_error, "etcd at ", state->http.describe(),
                        " granted no lease: ", grant->dump());
    state->keepalive = std::thread([s = state.get()] { s->keepalive_loop(); });
  } else {
    // No lease to grant: check that etcd answers, so a bad endpoint fails here.
    auto probe = retrying([&] {
      return state->http.post("/v3/kv/range",
                              {{"key", base64_encode(state->prefix)}, {"count_only", true}},
                              connect_until, {.retry_safe = true});
    });
    if (!probe) return std::move(probe).error().with_operation("store.connect");
    state->revoke_on_close = false;
  }
  std::unique_ptr<etcd_store> out(new etcd_store(state));
  out->set_timeout(options.timeout);
  TROUPE_LOG(log_level::debug, "store", "connected ", out->describe(), " with lease ", state->lease,
             " (TTL ", ttl_s, "s)");
  return out;
}

expected<std::unique_ptr<store>> connect_etcd_store(const etcd_store_options& options) {
  auto s = etcd_store::connect(options);
  if (!s) return std::move(s).error();
  return std::unique_ptr<store>(std::move(*s));
}

etcd_store::etcd_store(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

etcd_store::~etcd_store() { close(); }

void etcd_store::close() { impl_->close(); }

const std::string& etcd_store::prefix() const noexcept { return impl_->prefix; }

std::int64_t etcd_store::lease_id() const noexcept { return impl_->lease; }

std::string etcd_store::describe() const { return impl_->describe(); }

void etcd_store::abandon_lease_for_testing() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->revoke_on_close = false;
  }
  impl_->wake.notify_all();
  if (impl_->keepalive.joinable()) impl_->keepalive.join();
}

// ---------------------------------------------------------------------------------------
// The store calls.

expected<void> etcd_store::set(std::string_view key, std::span<const std::byte> value,
                               duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  TROUPE_TRY(impl_->usable());
  auto reply = impl_->post("/v3/kv/put", impl_->put_request(key, text_of(value)),
                           deadline::after(timeout), true);
  if (!reply) return impl_->annotate(std::move(reply).error(), "set");
  return ok();
}

expected<bytes> etcd_store::get(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  TROUPE_TRY(impl_->usable());
  const auto until = deadline::after(timeout);
  const std::string full = impl_->full(key);
  for (;;) {
    std::int64_t revision = 0;
    auto current = impl_->read(key, until, &revision);
    if (!current) return impl_->annotate(std::move(current).error(), "get");
    if (current->found) return to_bytes(current->value);

    // Absent: watch the key from just after the revision we read, so that a set racing
    // with this call is still seen.
    auto stream = impl_->watch(full, "", revision + 1, until);
    if (!stream) return impl_->annotate(std::move(stream).error(), "get");
    for (bool rewatch = false; !rewatch;) {
      auto message = (*stream)->next(until);
      if (!message) {
        if (message.error().code() == errc::timeout)
          return detail::store_timeout(describe(), "get", strcat("key '", key, "'"), timeout);
        return impl_->annotate(std::move(message).error(), "get");
      }
      auto decoded = decode_watch(*message, full);
      if (!decoded) return impl_->annotate(std::move(decoded).error(), "get");
      rewatch = decoded->compacted;
      for (auto& ev : decoded->events)
        if (!ev.deleted && ev.key == full) return to_bytes(ev.value);
    }
  }
}

expected<bool> etcd_store::check(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  TROUPE_TRY(impl_->usable());
  if (keys.empty()) return true;
  std::int64_t revision = 0;
  auto present = impl_->presence(keys, deadline::after(timeout), &revision);
  if (!present) return impl_->annotate(std::move(present).error(), "check");
  return std::all_of(present->begin(), present->end(), [](bool b) { return b; });
}

expected<std::int64_t> etcd_store::add(std::string_view key, std::int64_t delta, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  TROUPE_TRY(impl_->usable());
  const auto until = deadline::after(timeout);
  const std::string k64 = impl_->b64(key);
  auto current = impl_->read(key, until, nullptr);
  // Read, compute, and write back only if nobody wrote in between (same mod_revision);
  // otherwise the failed transaction hands back the new value and we try again.
  for (int attempt = 1;; ++attempt) {
    if (!current) return impl_->annotate(std::move(current).error(), "add");
    std::int64_t value = 0;
    if (current->found) {
      const std::string& text = current->value;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
        return make_error(errc::invalid_argument, "add on key '", key, "' of ", describe(),
                          ": its value '", text.substr(0, 32),
                          "' is not a decimal integer; add() only works on keys that hold a "
                          "number")
            .with_operation("store.add");
    }
    std::int64_t next = 0;
    if (__builtin_add_overflow(value, delta, &next))
      return make_error(errc::invalid_argument, "add on key '", key, "': ", value, " + ", delta,
                        " overflows a 64-bit integer")
          .with_operation("store.add");
    json compare =
        current->found
            ? json{{"key", k64},
                   {"target", "MOD"},
                   {"result", "EQUAL"},
                   {"mod_revision", std::to_string(current->mod_revision)}}
            : json{{"key", k64}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}};
    json txn = {{"compare", json::array({compare})},
                {"success",
                 json::array({{{"request_put", impl_->put_request(key, std::to_string(next))}}})},
                {"failure", json::array({{{"request_range", {{"key", k64}}}}})}};
    // Not retry_safe: a resend after an unseen success would add twice.
    auto reply = impl_->post("/v3/kv/txn", txn, until, false);
    if (!reply) return impl_->annotate(std::move(reply).error(), "add");
    if (reply->value("succeeded", false)) return next;
    if (until.expired())
      return detail::store_timeout(describe(), "add",
                                   strcat("a quiet moment to update key '", key, "' (", attempt,
                                          " attempts lost to concurrent writers)"),
                                   timeout);
    const json& responses = (*reply)["responses"];
    current = responses.empty() ? expected<kv_state>(kv_state{})
                                : kv_from_range(responses[0]["response_range"]);
    // Lost to a concurrent writer. From the second loss in a row, a pause drawn at random
    // up to 50 us x 2^attempt (6.4 ms at most): without it a writer that keeps losing to
    // faster ones (eight threads adding to one key on two loaded CPUs under the sanitizers)
    // could lose every round until its timeout.
    if (attempt >= 2) {
      thread_local std::minstd_rand rng{std::random_device{}()};
      std::uniform_int_distribution<std::int64_t> pick(0, std::int64_t{50} << std::min(attempt, 7));
      std::this_thread::sleep_for(std::min<std::chrono::microseconds>(
          std::chrono::microseconds(pick(rng)), until.remaining()));
    }
  }
}

expected<bytes> etcd_store::compare_set(std::string_view key,
                                        const std::optional<bytes>& expected_value,
                                        std::span<const std::byte> desired, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  TROUPE_TRY(impl_->usable());
  const std::string k64 = impl_->b64(key);
  json compare =
      expected_value
          ? json{{"key", k64},
                 {"target", "VALUE"},
                 {"result", "EQUAL"},
                 {"value", base64_encode(text_of(*expected_value))}}
          : json{{"key", k64}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}};
  json txn = {
      {"compare", json::array({compare})},
      {"success", json::array({{{"request_put", impl_->put_request(key, text_of(desired))}}})},
      {"failure", json::array({{{"request_range", {{"key", k64}}}}})}};
  // A resend after an unseen success finds `desired` stored and reports it: still right.
  auto reply = impl_->post("/v3/kv/txn", txn, deadline::after(timeout), true);
  if (!reply) return impl_->annotate(std::move(reply).error(), "compare_set");
  if (reply->value("succeeded", false)) return bytes(desired.begin(), desired.end());
  const json& responses = (*reply)["responses"];
  if (responses.empty()) return bytes{};
  auto current = kv_from_range(responses[0]["response_range"]);
  if (!current) return impl_->annotate(std::move(current).error(), "compare_set");
  // An absent key with an expected value stores nothing and reads as empty.
  return to_bytes(current->value);
}

expected<bool> etcd_store::erase(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  TROUPE_TRY(impl_->usable());
  auto reply = impl_->post("/v3/kv/deleterange", {{"key", impl_->b64(key)}},
                           deadline::after(timeout), false);
  if (!reply) return impl_->annotate(std::move(reply).error(), "erase");
  return json_int(*reply, "deleted") > 0;
}

expected<void> etcd_store::wait(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  TROUPE_TRY(impl_->usable());
  if (keys.empty()) return ok();
  const auto until = deadline::after(timeout);
  std::map<std::string, bool, std::less<>> present;  // full key -> exists
  auto missing_keys = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!present[impl_->full(k)]) out.push_back(k);
    return out;
  };
  for (;;) {
    std::int64_t revision = 0;
    auto now = impl_->presence(keys, until, &revision);
    if (!now) return impl_->annotate(std::move(now).error(), "wait");
    present.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) present[impl_->full(keys[i])] = (*now)[i];
    auto missing = missing_keys();
    if (missing.empty()) return ok();

    // Watch the span of the keys still missing, from just after the revision read, and
    // replay every change to the keys we wait for until all exist at once.
    auto [lo, hi] = std::minmax_element(missing.begin(), missing.end());
    const std::string first = impl_->full(*lo);
    const std::string end = *lo == *hi ? std::string{} : impl_->full(*hi) + std::string(1, '\0');
    auto stream = impl_->watch(first, end, revision + 1, until);
    if (!stream) return impl_->annotate(std::move(stream).error(), "wait");
    for (bool rewatch = false; !rewatch;) {
      auto message = (*stream)->next(until);
      if (!message) {
        if (message.error().code() == errc::timeout) {
          auto still = missing_keys();
          return detail::store_timeout(describe(), "wait", "keys " + detail::quote_keys(still),
                                       timeout);
        }
        return impl_->annotate(std::move(message).error(), "wait");
      }
      auto decoded = decode_watch(*message, first);
      if (!decoded) return impl_->annotate(std::move(decoded).error(), "wait");
      rewatch = decoded->compacted;
      for (auto& ev : decoded->events)
        if (auto it = present.find(ev.key); it != present.end()) it->second = !ev.deleted;
      if (!decoded->events.empty() && missing_keys().empty()) return ok();
    }
  }
}

expected<std::int64_t> etcd_store::num_keys(duration timeout) {
  return num_keys_with_prefix("", timeout);
}

expected<std::int64_t> etcd_store::num_keys_with_prefix(std::string_view sub, duration timeout) {
  TROUPE_TRY(impl_->usable());
  const std::string start = impl_->full(sub);
  auto reply = impl_->post("/v3/kv/range",
                           {{"key", base64_encode(start.empty() ? std::string(1, '\0') : start)},
                            {"range_end", base64_encode(range_end_of(start))},
                            {"count_only", true}},
                           deadline::after(timeout), true);
  if (!reply) return impl_->annotate(std::move(reply).error(), "num_keys");
  return json_int(*reply, "count");
}

}  // namespace troupe
