// The one JSON string writer of core, used by the trace files and the error file (and
// anything else that writes JSON by hand rather than through a JSON library).
#pragma once

#include <string>
#include <string_view>

namespace troupe {

/// Appends `s` to `out` as a JSON string: in double quotes, with '"', '\\', newline, tab
/// and carriage return escaped by name and every other control character as \u00XX.
/// Bytes from 0x80 up are copied as they are (UTF-8 passes through).
void append_json_string(std::string& out, std::string_view s);

}  // namespace troupe
