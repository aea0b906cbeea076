// strcat(...): concatenates anything printable with operator<< into a std::string.
#pragma once

#include <sstream>
#include <string>

namespace troupe {

template <class... Ts>
std::string strcat(const Ts&... parts) {
  if constexpr (sizeof...(Ts) == 0) {
    return {};
  } else {
    std::ostringstream os;
    (os << ... << parts);
    return std::move(os).str();
  }
}

}  // namespace troupe
