#include <troupe/actors/system.hpp>

#include <caf/atom.hpp>
#include <caf/sec.hpp>

namespace troupe::actors {

void configure(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  cfg.add_error_category(
      error_category,
      [](std::uint8_t code, caf::atom_value, const caf::message& context) -> std::string {
        if (context.match_elements<std::string>()) return context.get_as<std::string>(0);
        return std::string("troupe error: ") + std::string(to_string(static_cast<errc>(code)));
      });
}

caf::error to_caf_error(const error& e) {
  return caf::error(static_cast<std::uint8_t>(e.code()), error_category,
                    caf::make_message(e.to_string()));
}

error from_caf_error(const caf::error& e) {
  if (!e) return error(errc::internal, "no error");
  if (e.category() == error_category) {
    std::string text = e.context().match_elements<std::string>()
                           ? e.context().get_as<std::string>(0)
                           : std::string(to_string(static_cast<errc>(e.code())));
    return error(static_cast<errc>(e.code()), std::move(text));
  }
  if (e.category() == caf::atom("system")) {
    switch (static_cast<caf::sec>(e.code())) {
      case caf::sec::request_timeout:
        return error(errc::timeout, "the actor did not answer the request in time");
      case caf::sec::request_receiver_down:
        return error(errc::peer_left, "the actor that was asked has exited");
      case caf::sec::unexpected_message:
        return error(errc::invalid_argument, "the actor has no handler for this message");
      default:
        break;
    }
  }
  return error(errc::internal, "CAF error: " + caf::to_string(e));
}

}  // namespace troupe::actors
