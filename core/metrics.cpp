#include <troupe/core/metrics.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>

#include <troupe/core/settings.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::metrics {

namespace {

constexpr double latency_bounds[] = {1e-5,   2.5e-5, 5e-5, 1e-4,   2.5e-4, 5e-4, 1e-3,
                                     2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25,
                                     0.5,    1,      2.5,  5,      10};

struct entry {
  std::string name;
  std::string help;
  metrics::labels label_set;
  std::variant<std::unique_ptr<counter>, std::unique_ptr<gauge>, std::unique_ptr<histogram>> metric;
};

// Never destroyed: metrics are updated from threads that may outlive static destruction,
// and the exporter's atexit handler reads them.
struct registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<entry>> entries;  // key: name{labels}
  std::map<std::string, std::size_t, std::less<>> kinds;  // name -> variant index
};

registry& the_registry() {
  static registry* r = new registry;
  return *r;
}

std::string key_of(std::string_view name, const labels& ls) {
  std::string k(name);
  k += '{';
  for (const auto& [n, v] : ls) k += strcat(n, '=', v, ',');
  k += '}';
  return k;
}

template <class M, class Make>
M& find_or_add(std::string_view name, std::string_view help, const labels& ls, Make make) {
  auto& r = the_registry();
  std::lock_guard lk(r.mu);
  auto key = key_of(name, ls);
  constexpr std::size_t want = std::is_same_v<M, counter> ? 0 : std::is_same_v<M, gauge> ? 1 : 2;
  if (auto k = r.kinds.find(name); k != r.kinds.end() && k->second != want) {
    std::fprintf(stderr, "troupe: metric '%.*s' registered twice with different types\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  auto it = r.entries.find(key);
  if (it == r.entries.end()) {
    auto e = std::make_unique<entry>();
    e->name = name;
    e->help = help;
    e->label_set = ls;
    e->metric = make();
    r.kinds.emplace(std::string(name), want);
    it = r.entries.emplace(std::move(key), std::move(e)).first;
  }
  return *std::get<want>(it->second->metric);
}

std::string format_double(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("0");
}

std::string_view kind_letter(kind k) {
  switch (k) {
    case kind::counter:
      return "c";
    case kind::gauge:
      return "g";
    case kind::histogram:
      return "h";
  }
  return "c";
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    auto p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? p : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

bool parse_double(std::string_view s, double& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_u64(std::string_view s, std::uint64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string label_text(const labels& ls, std::string_view le = {}) {
  if (ls.empty() && le.empty()) return {};
  std::string s = "{";
  bool first = true;
  for (const auto& [n, v] : ls) {
    s += strcat(first ? "" : ",", n, "=\"", escape_label_value(v), '"');
    first = false;
  }
  if (!le.empty()) s += strcat(first ? "" : ",", "le=\"", le, '"');
  return s + "}";
}

// The exporter: one thread per process, stopped and flushed at exit.
struct exporter {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::string path;
  duration interval{};
  pid_t pid = 0;  // a forked child has no exporter thread: it neither joins nor writes
  std::thread thread;
};

exporter* the_exporter = nullptr;

void write_snapshot(const std::string& path) {
  const auto text = encode_snapshot(snapshot());
  const std::string tmp = strcat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;  // the folder is gone (a stopped attempt): nothing to report to
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    std::remove(tmp.c_str());
}

void stop_export_at_exit() {
  exporter* e = the_exporter;
  if (e == nullptr || e->pid != ::getpid()) return;
  {
    std::lock_guard lk(e->mu);
    e->stop = true;
  }
  e->cv.notify_all();
  if (e->thread.joinable()) e->thread.join();
  write_snapshot(e->path);
}

}  // namespace

histogram::histogram(std::span<const double> bounds) {
  size_ = std::min(bounds.size(), max_buckets);
  std::copy_n(bounds.begin(), size_, bounds_.begin());
}

std::size_t histogram::bucket_of(double v) const noexcept {
  std::size_t i = 0;
  while (i < size_ && v > bounds_[i]) ++i;
  return i;
}

void histogram::observe(double v) noexcept {
  counts_[bucket_of(v)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void histogram::add(std::span<const std::uint64_t> counts, double sum) noexcept {
  const std::size_t n = std::min(counts.size(), size_ + 1);
  for (std::size_t i = 0; i < n; ++i)
    if (counts[i] != 0) counts_[i].fetch_add(counts[i], std::memory_order_relaxed);
  sum_.fetch_add(sum, std::memory_order_relaxed);
}

std::span<const double> latency_buckets() noexcept { return latency_bounds; }

std::string_view size_class(std::size_t bytes) noexcept {
  if (bytes <= 1024) return "1KiB";
  if (bytes <= 16 * 1024) return "16KiB";
  if (bytes <= 256 * 1024) return "256KiB";
  if (bytes <= 4 * 1024 * 1024) return "4MiB";
  if (bytes <= 64 * 1024 * 1024) return "64MiB";
  return "large";
}

counter& get_counter(std::string_view name, std::string_view help, const labels& ls) {
  return find_or_add<counter>(name, help, ls, [] { return std::make_unique<counter>(); });
}

gauge& get_gauge(std::string_view name, std::string_view help, const labels& ls) {
  return find_or_add<gauge>(name, help, ls, [] { return std::make_unique<gauge>(); });
}

histogram& get_histogram(std::string_view name, std::string_view help,
                         std::span<const double> bounds, const labels& ls) {
  return find_or_add<histogram>(name, help, ls,
                                [bounds] { return std::make_unique<histogram>(bounds); });
}

std::vector<sample> snapshot() {
  auto& r = the_registry();
  std::vector<sample> out;
  std::lock_guard lk(r.mu);
  out.reserve(r.entries.size());
  for (const auto& [key, e] : r.entries) {
    sample s;
    s.name = e->name;
    s.help = e->help;
    s.label_set = e->label_set;
    if (auto* c = std::get_if<0>(&e->metric)) {
      s.kind = kind::counter;
      s.value = static_cast<double>((*c)->value());
    } else if (auto* g = std::get_if<1>(&e->metric)) {
      s.kind = kind::gauge;
      s.value = static_cast<double>((*g)->value());
    } else {
      const histogram& h = *std::get<2>(e->metric);
      s.kind = kind::histogram;
      s.bounds.assign(h.bounds().begin(), h.bounds().end());
      std::uint64_t total = 0;
      for (std::size_t i = 0; i <= s.bounds.size(); ++i) {
        total += h.bucket(i);
        s.cumulative.push_back(total);
      }
      s.sum = h.sum();
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Format, one metric per line, fields separated by single spaces:
//   troupe-metrics 1
//   c NAME LABELS VALUE                     (LABELS: k=v,k=v or -)
//   g NAME LABELS VALUE
//   h NAME LABELS SUM BOUND:COUNT,...,+Inf:COUNT   (cumulative counts)
//   # NAME HELP...                          (help, once per name, before its metrics)
std::string encode_snapshot(std::span<const sample> samples) {
  std::string out = "troupe-metrics 1\n";
  std::string_view last_help;
  for (const auto& s : samples) {
    if (s.name != last_help) {
      out += strcat("# ", s.name, ' ', s.help, '\n');
      last_help = s.name;
    }
    std::string ls;
    for (const auto& [n, v] : s.label_set) ls += strcat(ls.empty() ? "" : ",", n, '=', v);
    if (ls.empty()) ls = "-";
    out += strcat(kind_letter(s.kind), ' ', s.name, ' ', ls, ' ');
    if (s.kind != kind::histogram) {
      out += format_double(s.value);
    } else {
      out += format_double(s.sum);
      out += ' ';
      for (std::size_t i = 0; i < s.cumulative.size(); ++i) {
        out += strcat(i == 0 ? "" : ",", i < s.bounds.size() ? format_double(s.bounds[i]) : "+Inf",
                      ':', s.cumulative[i]);
      }
    }
    out += '\n';
  }
  return out;
}

expected<std::vector<sample>> decode_snapshot(std::string_view text) {
  std::vector<sample> out;
  std::map<std::string, std::string, std::less<>> helps;
  auto lines = split(text, '\n');
  if (lines.empty() || lines.front() != "troupe-metrics 1")
    return make_error(errc::protocol_error,
                      "a metrics snapshot must start with 'troupe-metrics 1'");
  for (std::size_t n = 1; n < lines.size(); ++n) {
    std::string_view line = lines[n];
    if (line.empty()) continue;
    auto bad = [&] {
      return make_error(errc::protocol_error, "metrics snapshot line ", n + 1, " is malformed: '",
                        line.substr(0, 120), "'");
    };
    if (line.starts_with("# ")) {
      auto rest = line.substr(2);
      auto sp = rest.find(' ');
      if (sp == std::string_view::npos) return bad();
      helps[std::string(rest.substr(0, sp))] = std::string(rest.substr(sp + 1));
      continue;
    }
    auto f = split(line, ' ');
    if (f.size() < 4) return bad();
    sample s;
    if (f[0] == "c")
      s.kind = kind::counter;
    else if (f[0] == "g")
      s.kind = kind::gauge;
    else if (f[0] == "h")
      s.kind = kind::histogram;
    else
      return bad();
    s.name = f[1];
    if (s.name.empty()) return bad();
    if (auto h = helps.find(s.name); h != helps.end()) s.help = h->second;
    if (f[2] != "-") {
      for (auto kv : split(f[2], ',')) {
        auto eq = kv.find('=');
        if (eq == std::string_view::npos || eq == 0) return bad();
        s.label_set.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
      }
    }
    if (s.kind != kind::histogram) {
      if (f.size() != 4 || !parse_double(f[3], s.value)) return bad();
    } else {
      if (f.size() != 5 || !parse_double(f[3], s.sum)) return bad();
      auto buckets = split(f[4], ',');
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        auto colon = buckets[i].rfind(':');
        if (colon == std::string_view::npos) return bad();
        std::uint64_t c = 0;
        if (!parse_u64(buckets[i].substr(colon + 1), c)) return bad();
        auto bound = buckets[i].substr(0, colon);
        if (i + 1 == buckets.size()) {
          if (bound != "+Inf") return bad();
        } else {
          double b = 0;
          if (!parse_double(bound, b)) return bad();
          s.bounds.push_back(b);
        }
        s.cumulative.push_back(c);
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string prometheus_text(std::vector<sample> samples) {
  std::stable_sort(samples.begin(), samples.end(),
                   [](const sample& a, const sample& b) { return a.name < b.name; });
  std::string out;
  std::string_view current;
  for (const auto& s : samples) {
    if (s.name != current) {
      std::string help = s.help;
      std::replace(help.begin(), help.end(), '\n', ' ');
      out += strcat("# HELP ", s.name, ' ', help, '\n');
      out += strcat("# TYPE ", s.name, ' ',
                    s.kind == kind::counter ? "counter"
                    : s.kind == kind::gauge ? "gauge"
                                            : "histogram",
                    '\n');
      current = s.name;
    }
    if (s.kind != kind::histogram) {
      out += strcat(s.name, label_text(s.label_set), ' ', format_double(s.value), '\n');
      continue;
    }
    for (std::size_t i = 0; i < s.cumulative.size(); ++i) {
      const std::string le = i < s.bounds.size() ? format_double(s.bounds[i]) : "+Inf";
      out += strcat(s.name, "_bucket", label_text(s.label_set, le), ' ', s.cumulative[i], '\n');
    }
    out += strcat(s.name, "_sum", label_text(s.label_set), ' ', format_double(s.sum), '\n');
    out += strcat(s.name, "_count", label_text(s.label_set), ' ',
                  s.cumulative.empty() ? 0 : s.cumulative.back(), '\n');
  }
  return out;
}

void start_export(const std::string& path, duration interval) {
  static std::once_flag once;
  std::call_once(once, [&] {
    auto* e = new exporter;  // never freed: the atexit handler may run at any point
    e->path = path;
    e->interval = interval;
    e->pid = ::getpid();
    write_snapshot(path);
    e->thread = std::thread([e] {
      std::unique_lock lk(e->mu);
      while (!e->stop) {
        e->cv.wait_for(lk, e->interval, [e] { return e->stop; });
        if (e->stop) break;
        lk.unlock();
        write_snapshot(e->path);
        lk.lock();
      }
    });
    the_exporter = e;
    std::atexit(stop_export_at_exit);
  });
}

void start_export_from_env() {
  if (auto path = settings::metrics_file.value()) start_export(*path);
}

}  // namespace troupe::metrics
