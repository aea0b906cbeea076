#include <troupe/membership/epoch.hpp>

#include <algorithm>
#include <charconv>
#include <sstream>

#include <troupe/core/strcat.hpp>

namespace troupe::membership {

namespace {

constexpr std::string_view record_header = "troupe-epoch 1";

bool removed_by(const member& m, const epoch_change& change) {
  return std::any_of(change.remove.begin(), change.remove.end(), [&](const member_ref& r) {
    return r.name == m.name && (r.incarnation.empty() || r.incarnation == m.incarnation);
  });
}

std::string list_of(const std::vector<const member*>& ms) {
  if (ms.empty()) return "nobody";
  std::string out;
  for (const auto* m : ms) {
    if (!out.empty()) out += ", ";
    out += describe(*m);
  }
  return out;
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && p == text.data() + text.size();
}

}  // namespace

std::string describe(const member& m) {
  return strcat(m.name, " (rank ", m.rank, ", host ", m.host, ", pid ", m.pid, ")");
}

const member* epoch::find(std::string_view name) const {
  for (const auto& m : members)
    if (m.name == name) return &m;
  return nullptr;
}

bool epoch::contains(std::string_view name, std::string_view incarnation) const {
  const member* m = find(name);
  return m != nullptr && (incarnation.empty() || m->incarnation == incarnation);
}

std::string epoch::names() const {
  std::string out;
  for (const auto& m : members) {
    if (!out.empty()) out += ',';
    out += m.name;
  }
  return out;
}

expected<epoch> next_epoch(const epoch& current, const epoch_change& change) {
  if (change.proposer && !current.contains(change.proposer->name, change.proposer->incarnation))
    return current;
  epoch next;
  next.number = current.number + 1;
  next.cause = change.cause;
  bool changed = false;
  for (const auto& m : current.members) {
    if (removed_by(m, change)) {
      changed = true;
    } else {
      next.members.push_back(m);
    }
  }
  std::vector<member> joiners;
  for (const auto& j : change.add) {
    if (const member* held = next.find(j.name)) {
      if (held->incarnation == j.incarnation) continue;
      return make_error(errc::already_exists, "cannot add ", j.name, " (host ", j.host, ", pid ",
                        j.pid, ") to the job: epoch ", current.number, " already has ",
                        describe(*held),
                        "; wait until it leaves or is declared dead, or pick another name");
    }
    if (std::any_of(joiners.begin(), joiners.end(),
                    [&](const member& o) { return o.name == j.name; }))
      return make_error(errc::invalid_argument, "one change adds the name ", j.name, " twice");
    joiners.push_back(j);
  }
  std::sort(joiners.begin(), joiners.end(),
            [](const member& a, const member& b) { return a.name < b.name; });
  if (!joiners.empty()) changed = true;
  if (!changed) return current;
  for (auto& j : joiners) next.members.push_back(std::move(j));
  for (std::size_t i = 0; i < next.members.size(); ++i) next.members[i].rank = static_cast<int>(i);
  return next;
}

std::string encode(const epoch& e) {
  std::string out(record_header);
  out += strcat("\nnumber ", e.number, "\ncause ");
  for (char c : e.cause) out += (c == '\n' || c == '\r') ? ' ' : c;
  for (const auto& m : e.members)
    out += strcat("\nmember ", m.name, " ", m.host, " ", m.pid, " ", m.incarnation);
  out += '\n';
  return out;
}

expected<epoch> decode(std::string_view record) {
  auto bad = [&](std::string_view line, std::string_view why) {
    return make_error(errc::protocol_error, "bad epoch record line '", line, "': ", why,
                      "; the store's membership keys were written by something else");
  };
  epoch e;
  std::size_t pos = 0;
  int line_no = 0;
  bool have_number = false;
  while (pos < record.size()) {
    auto nl = record.find('\n', pos);
    if (nl == std::string_view::npos) nl = record.size();
    std::string_view line = record.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line_no == 1) {
      if (line != record_header) return bad(line, "expected the header 'troupe-epoch 1'");
      continue;
    }
    if (line.empty()) continue;
    auto sp = line.find(' ');
    std::string_view field = line.substr(0, sp);
    std::string_view rest = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
    if (field == "number") {
      if (!parse_int(rest, e.number)) return bad(line, "the number is not an integer");
      have_number = true;
    } else if (field == "cause") {
      e.cause = std::string(rest);
    } else if (field == "member") {
      std::istringstream in{std::string(rest)};
      member m;
      std::string pid;
      if (!(in >> m.name >> m.host >> pid >> m.incarnation) || !parse_int(pid, m.pid))
        return bad(line, "expected 'member <name> <host> <pid> <incarnation>'");
      m.rank = static_cast<int>(e.members.size());
      e.members.push_back(std::move(m));
    } else {
      return bad(line, "unknown field");
    }
  }
  if (line_no == 0) return bad("", "the record is empty");
  if (!have_number) return bad("", "the record has no number");
  return e;
}

bool valid_token(std::string_view text) noexcept {
  if (text.empty()) return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) > 0x20 && c != 0x7f; });
}

error membership_changed_error(const epoch& before, const epoch& after) {
  std::vector<const member*> left, came;
  for (const auto& m : before.members)
    if (!after.contains(m.name, m.incarnation)) left.push_back(&m);
  for (const auto& m : after.members)
    if (!before.contains(m.name, m.incarnation)) came.push_back(&m);
  return make_error(errc::membership_changed, "membership changed from epoch ", before.number,
                    " to epoch ", after.number, " (", after.size(), " members: ", after.names(),
                    "); left: ", list_of(left), "; came: ", list_of(came),
                    after.cause.empty() ? "" : "; cause: ", after.cause,
                    "; work begun in an older epoch must be redone in this one");
}

}  // namespace troupe::membership
