// Message types and actors shared by the multi-process actor tests and their worker.
#pragma once

#include <caf/all.hpp>
#include <string>
#include <vector>

#include <troupe/actors/system.hpp>

namespace troupe::actors::testing {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using quit_atom = caf::atom_constant<caf::atom("quit")>;
using add_atom = caf::atom_constant<caf::atom("add")>;

struct point {
  std::int32_t x = 0;
  std::int32_t y = 0;
  std::string label;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, point& p) {
  return f(caf::meta::type_name("point"), p.x, p.y, p.label);
}

/// Registered on the driver only: the worker refuses it, naming it.
struct driver_only {
  std::int32_t v = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, driver_only& d) {
  return f(caf::meta::type_name("driver_only"), d.v);
}

/// Registered nowhere: the sender refuses it, naming it.
struct never_registered {
  std::int32_t v = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, never_registered& n) {
  return f(n.v);
}

using calculator =
    caf::typed_actor<caf::replies_to<add_atom, std::int32_t, std::int32_t>::with<std::int32_t>>;

/// Replies: (ping, n) -> n + 1; string -> same string; point -> point mirrored.
inline caf::behavior echo_actor(caf::event_based_actor*) {
  return {
      [](ping_atom, std::int32_t n) { return n + 1; },
      [](const std::string& s) { return s; },
      [](const point& p) {
        return point{p.y, p.x, p.label + "'"};
      },
  };
}

/// Records every integer sent to it; (get) returns them in arrival order.
inline caf::behavior counter_actor(caf::stateful_actor<std::vector<std::int32_t>>* self) {
  return {
      [self](std::int32_t n) { self->state.push_back(n); },
      [self](get_atom) { return self->state; },
  };
}

/// Exits on (quit).
inline caf::behavior mortal_actor(caf::event_based_actor* self) {
  return {[self](quit_atom) { self->quit(); }, [](ping_atom, std::int32_t n) { return n + 1; }};
}

inline calculator::behavior_type calculator_actor() {
  return {[](add_atom, std::int32_t a, std::int32_t b) { return a + b; }};
}

/// The registry every test process builds, plus driver_only on the driver.
inline void register_types(caf::actor_system_config& cfg, message_types& types, bool driver) {
  (void)add_message_type<point>(cfg, types, "point");
  if (driver) (void)add_message_type<driver_only>(cfg, types, "driver_only");
  cfg.add_message_type<std::vector<std::int32_t>>("std::vector<int32_t>");
  (void)types.add<std::vector<std::int32_t>>("vector<i32>");
}

}  // namespace troupe::actors::testing
