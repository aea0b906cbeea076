// Embedding: the CAF side of a troupe worker. troupe attaches to the application's
// caf::actor_system; make_actor_system_config() gives one with the settings troupe needs
// and sane defaults, and add_message_type() registers a type with CAF and with troupe's
// remote-message registry in one call.
//
// Errors that cross from troupe to CAF code are caf::error values of category "troupe"
// whose code is the troupe::errc value and whose context carries the full text;
// `system.render(err)` prints it.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <memory>
#include <string>

#include <troupe/actors/message_types.hpp>
#include <troupe/core/error.hpp>

namespace troupe::actors {

/// The category atom of troupe errors inside CAF.
inline constexpr caf::atom_value error_category = caf::atom("troupe");

/// A CAF config for a troupe worker: the sharing scheduler (blocking requests from
/// scoped actors are an order of magnitude faster with it; CAF ignores the setting when
/// given as a string, so it is set as an atom), quiet logging, and troupe's error
/// category registered for rendering.
void configure(caf::actor_system_config& cfg);

/// Registers `T` under `name` with CAF (`add_message_type`) and with `types`, the
/// registry the node encodes remote messages with.
template <class T>
expected<void> add_message_type(caf::actor_system_config& cfg, message_types& types,
                                const std::string& name) {
  TROUPE_TRY(types.add<T>(name));
  cfg.add_message_type<T>(name);
  return ok();
}

/// troupe error -> CAF error of category "troupe" (code: the errc value).
caf::error to_caf_error(const error& e);
/// CAF error -> troupe error: "troupe" errors keep their code and text; CAF's own become
/// errc values where one fits (request_timeout -> timeout, request_receiver_down ->
/// peer_left, unexpected_message -> invalid_argument), else errc::internal with the text.
error from_caf_error(const caf::error& e);

}  // namespace troupe::actors
