#include <doctest/doctest.h>

#include <cstdlib>
#include <set>
#include <string>

#include <troupe/core/settings.hpp>

using namespace troupe;

namespace {

constexpr setting example{"TROUPE_SETTING_TEST_VALUE", "unset", "a setting for this test",
                          "TROUPE_SETTING_TEST_OLD"};

struct clean_env {
  clean_env() { clear(); }
  ~clean_env() { clear(); }
  static void clear() {
    ::unsetenv("TROUPE_SETTING_TEST_VALUE");
    ::unsetenv("TROUPE_SETTING_TEST_OLD");
  }
};

}  // namespace

TEST_CASE("a setting reads its variable, then its older name, and treats empty as unset") {
  clean_env guard;
  CHECK_FALSE(example.value().has_value());
  ::setenv("TROUPE_SETTING_TEST_OLD", "old", 1);
  CHECK(example.value() == std::optional<std::string>("old"));
  ::setenv("TROUPE_SETTING_TEST_VALUE", "new", 1);
  CHECK(example.value() == std::optional<std::string>("new"));
  ::setenv("TROUPE_SETTING_TEST_VALUE", "", 1);
  CHECK(example.value() == std::optional<std::string>("old"));
  ::setenv("TROUPE_SETTING_TEST_OLD", "", 1);
  CHECK_FALSE(example.value().has_value());
}

TEST_CASE("a setting looks up a captured environment the same way") {
  std::map<std::string, std::string> vars{{"TROUPE_SETTING_TEST_OLD", "old"}};
  REQUIRE(example.find_in(vars) != nullptr);
  CHECK(*example.find_in(vars) == "old");
  vars["TROUPE_SETTING_TEST_VALUE"] = "new";
  CHECK(*example.find_in(vars) == "new");
  vars["TROUPE_SETTING_TEST_VALUE"] = "";
  vars["TROUPE_SETTING_TEST_OLD"] = "";
  CHECK(example.find_in(vars) == nullptr);
}

TEST_CASE("every setting core declares has a distinct TROUPE_ name, a default and a meaning") {
  std::set<std::string_view> seen;
  for (const setting* s : settings::core_settings()) {
    INFO(std::string(s->variable));
    CHECK(s->variable.starts_with("TROUPE_"));
    CHECK_FALSE(s->default_value.empty());
    CHECK(s->doc.size() > 10);
    CHECK(s->doc.find('|') == std::string_view::npos);  // would break the Markdown table
    CHECK(seen.insert(s->variable).second);
  }
  CHECK(seen.size() == 14);
}

TEST_CASE("the generated table has one row per setting after its header") {
  const setting* one[] = {&example};
  setting_list lists[] = {one};
  const std::string table = settings_markdown(lists);
  CHECK(table ==
        "| variable | default | meaning |\n|---|---|---|\n"
        "| `TROUPE_SETTING_TEST_VALUE` | unset | a setting for this test |\n");
}
