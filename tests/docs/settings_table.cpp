// Keeps the table of environment settings true.
//
//   settings_table                      prints the table generated from the declarations
//   settings_table --check <source dir> fails, naming what differs, when docs/settings.md or
//                                       the README holds another table, or when the library
//                                       names a TROUPE_ variable that no module declares
//   settings_table --write <source dir> rewrites both tables from the declarations
//
// The tables sit between the two marker lines below, in docs/settings.md and README.md.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/collectives/settings.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/membership/settings.hpp>
#include <troupe/store/settings.hpp>

namespace fs = std::filesystem;

namespace {

constexpr std::string_view begin_marker =
    "<!-- settings table: generated from core/, store/ and collectives/settings.hpp -->";
constexpr std::string_view end_marker = "<!-- end of settings table -->";

std::vector<troupe::setting_list> all_lists() {
  return {troupe::settings::core_settings(), troupe::settings::store_settings(),
          troupe::settings::membership_settings(), troupe::settings::collectives_settings()};
}

std::string generated() { return troupe::settings_markdown(all_lists()); }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text between the markers of `doc`, or an error message in `problem`.
bool block_of(const std::string& doc, std::string& block, std::size_t& from, std::size_t& to,
              std::string& problem) {
  auto b = doc.find(begin_marker);
  auto e = doc.find(end_marker);
  if (b == std::string::npos || e == std::string::npos || e < b) {
    problem = "has no table between the lines '" + std::string(begin_marker) + "' and '" +
              std::string(end_marker) + "'";
    return false;
  }
  from = doc.find('\n', b) + 1;
  to = e;
  block = doc.substr(from, to - from);
  return true;
}

// Every TROUPE_ name a library source spells, with the first file that spells it.
std::map<std::string, std::string> names_in_sources(const fs::path& root) {
  static const std::regex token("TROUPE_[A-Z0-9_]+");
  std::map<std::string, std::string> out;
  for (const char* dir : {"core", "devicemap", "store", "membership", "rpc", "collectives",
                          "actors", "launcher", "world"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& f : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = f.path().extension();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu") continue;
      const std::string text = read_file(f.path());
      for (std::sregex_iterator it(text.begin(), text.end(), token), end; it != end; ++it)
        out.emplace(it->str(), fs::relative(f.path(), root).string());
    }
  }
  return out;
}

// Names that are not environment variables: macros the sources define and the CMake
// options and definitions the build passes in.
std::set<std::string> non_settings(const fs::path& root) {
  std::set<std::string> out;
  static const std::regex define("#\\s*define\\s+(TROUPE_[A-Z0-9_]+)");
  static const std::regex token("TROUPE_[A-Z0-9_]+");
  for (const auto& f : fs::recursive_directory_iterator(root)) {
    const auto rel = fs::relative(f.path(), root).string();
    if (rel.starts_with("build") || rel.starts_with(".git")) continue;
    const auto name = f.path().filename().string();
    const auto ext = f.path().extension();
    const std::string text = (ext == ".cpp" || ext == ".hpp" || ext == ".h" ||
                              name == "CMakeLists.txt" || ext == ".cmake" || ext == ".in")
                                 ? read_file(f.path())
                                 : std::string();
    if (text.empty()) continue;
    if (name == "CMakeLists.txt" || ext == ".cmake" || ext == ".in") {
      for (std::sregex_iterator it(text.begin(), text.end(), token), end; it != end; ++it)
        out.insert(it->str());
    } else {
      for (std::sregex_iterator it(text.begin(), text.end(), define), end; it != end; ++it)
        out.insert((*it)[1].str());
    }
  }
  return out;
}

int check(const fs::path& root) {
  int failures = 0;
  const std::string want = generated();
  for (const char* doc : {"docs/settings.md", "README.md"}) {
    std::string block, problem;
    std::size_t from = 0, to = 0;
    if (!block_of(read_file(root / doc), block, from, to, problem)) {
      std::cerr << doc << " " << problem << "\n";
      ++failures;
    } else if (block != want) {
      std::cerr << doc << "'s table of settings differs from the declarations; run "
                << "`settings_table --write " << root.string()
                << "` (in the build's tests/docs) and commit the result. The declarations "
                   "give:\n"
                << want;
      ++failures;
    }
  }
  std::set<std::string> declared;
  for (const auto& list : all_lists())
    for (const troupe::setting* s : list) {
      if (declared.count(std::string(s->variable))) {
        std::cerr << s->variable << " is declared twice; keep one declaration\n";
        ++failures;
      }
      if ((std::string(s->default_value) + std::string(s->doc)).find('|') != std::string::npos) {
        std::cerr << s->variable << "'s default or meaning holds a '|', which breaks the "
                  << "Markdown table; write it another way\n";
        ++failures;
      }
      declared.emplace(s->variable);
      if (!s->fallback.empty()) declared.emplace(s->fallback);
    }
  const auto excluded = non_settings(root);
  for (const auto& [name, file] : names_in_sources(root))
    if (!declared.count(name) && !excluded.count(name)) {
      std::cerr << file << " names " << name
                << ", which no settings.hpp declares: declare it in its module's settings.hpp "
                   "(variable, default, meaning) and list it there\n";
      ++failures;
    }
  if (failures == 0)
    std::cout << "the settings tables match the " << declared.size()
              << " declared variables, and the sources name no other\n";
  return failures == 0 ? 0 : 1;
}

int write(const fs::path& root) {
  for (const char* doc : {"docs/settings.md", "README.md"}) {
    std::string text = read_file(root / doc), block, problem;
    std::size_t from = 0, to = 0;
    if (!block_of(text, block, from, to, problem)) {
      std::cerr << doc << " " << problem << "; add those two lines where the table goes\n";
      return 1;
    }
    text.replace(from, to - from, generated());
    std::ofstream(root / doc) << text;
    std::cout << "wrote " << (root / doc).string() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode.empty()) {
    std::cout << generated();
    return 0;
  }
  if ((mode == "--check" || mode == "--write") && argc == 3) {
    const fs::path root(argv[2]);
    if (!fs::exists(root / "README.md")) {
      std::cerr << "settings_table: " << root.string()
                << " holds no README.md; give the source folder of troupe\n";
      return 2;
    }
    return mode == "--check" ? check(root) : write(root);
  }
  std::cerr << "usage: settings_table [--check <source dir> | --write <source dir>]\n";
  return 2;
}
