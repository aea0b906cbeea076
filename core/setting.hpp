// One environment setting, declared once: its variable, its default and what it does.
//
// Each module declares the variables it reads or sets in its own settings.hpp (core/, store/,
// collectives/), as constants of this type, and lists them for the generated table in
// docs/settings.md and the README. Code names a variable only through its constant, so the
// spelling, the default and the documentation cannot drift apart.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace troupe {

/// An environment variable troupe reads (or troupe-run sets for its workers).
struct setting {
  /// The variable's name, e.g. "TROUPE_DEFAULT_TIMEOUT".
  std::string_view variable;
  /// The default as users read it ("5m", "unset", "on"), or what decides it when derived.
  std::string_view default_value;
  /// What it does and which values it takes, one paragraph of Markdown.
  std::string_view doc;
  /// An older or foreign name read when `variable` is unset (empty: none).
  std::string_view fallback = {};

  /// The value in this process's environment: `variable`, else `fallback`. Unset and empty
  /// both read as nullopt.
  std::optional<std::string> value() const;

  /// The same lookup in a captured copy of an environment (name -> value); nullptr when
  /// neither name is there with a non-empty value. The pointer lives as long as `vars`.
  const std::string* find_in(const std::map<std::string, std::string>& vars) const;
};

/// A list of settings, as each module hands out its own.
using setting_list = std::span<const setting* const>;

/// The Markdown table ("| variable | default | meaning |") of `lists`, in the order given.
/// docs/settings.md and the README hold its output; a test keeps them equal.
std::string settings_markdown(std::span<const setting_list> lists);

}  // namespace troupe
