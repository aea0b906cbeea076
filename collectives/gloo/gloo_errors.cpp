#include <troupe/collectives/gloo/gloo_errors.hpp>

#include <gloo/common/error.h>

#include <exception>
#include <string>

namespace troupe::collectives::gloo_errors {

troupe::error error_of(const gloo::IoException& e) {
  std::string what = e.what();
  const bool timed_out = what.find("imed out") != std::string::npos;
  return troupe::error(timed_out ? errc::timeout : errc::connection_lost, "gloo: " + what);
}

troupe::error current_error() {
  try {
    throw;
  } catch (const troupe::exception& e) {
    return e.err();
  } catch (const gloo::IoException& e) {
    return error_of(e);
  } catch (const std::exception& e) {
    return troupe::error(errc::internal, std::string("gloo: ") + e.what());
  } catch (...) {
    return troupe::error(errc::internal, "gloo raised a non-standard exception");
  }
}

}  // namespace troupe::collectives::gloo_errors
