// message_types: which element types a CAF message may carry to another worker, and their
// byte form. A message crosses workers element by element, each written with troupe's
// binary serializer (the one RPC uses, see docs/rpc.md): a user type becomes sendable with
// one `inspect` overload and one registration under a name that every worker uses.
//
// Built in: atoms, bool, the fixed-width integers, float, double, std::string, and vectors
// of strings. Tensors (troupe::tensor) inside a registered type travel outside the
// message bytes, as RPC tensors do.
//
// Byte form of a message: u16 element count, then per element a u8 code (builtin) or 0
// followed by the registered name, then the element's bytes.
//
// Thread safety: register every type before the first message is sent or received
// (typically right after building the actor system config); encode and decode may then
// run on any thread.
#pragma once

#include <caf/message.hpp>
#include <caf/message_builder.hpp>
#include <functional>
#include <span>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include <troupe/actors/caf_inspect.hpp>
#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/rpc/serializer.hpp>

namespace caf {
class actor_system_config;
}

namespace troupe::actors {

class message_types {
 public:
  /// A registry holding the built-in types only.
  message_types();

  /// Registers `T` under `name` for remote messages. The name must be the same on every
  /// worker. Refuses an empty name, a name taken by another type, and a second name for
  /// the same type (invalid_argument, naming both).
  template <class T>
  expected<void> add(std::string name) {
    entry e;
    e.name = name;
    e.save = [](const void* p, rpc::binary_serializer& f) -> expected<void> {
      if (auto r = f(*static_cast<const T*>(p))) return r.err();
      return ok();
    };
    e.load = [](rpc::binary_deserializer& f, caf::message_builder& mb) -> expected<void> {
      T x{};
      if (auto r = f(x)) return r.err();
      mb.append(std::move(x));
      return ok();
    };
    return add_entry(typeid(T), std::move(e));
  }

  /// Writes the elements of `m` to `out`; tensors inside them go to `tensors`. Fails with
  /// unsupported naming the first element type that is not registered.
  expected<void> encode(const caf::message& m, bytes& out, std::vector<tensor>* tensors) const;

  /// Rebuilds a message from `in`. Fails with protocol_error for malformed bytes and with
  /// unsupported naming a type this worker has not registered.
  expected<caf::message> decode(std::span<const std::byte> in, std::vector<tensor>* tensors) const;

  /// Whether `name` is registered (built-in names start with '@').
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }

 private:
  struct entry {
    std::string name;
    std::uint8_t code = 0;  // non-zero for built-ins
    std::function<expected<void>(const void*, rpc::binary_serializer&)> save;
    std::function<expected<void>(rpc::binary_deserializer&, caf::message_builder&)> load;
  };
  template <class T>
  void add_builtin(std::uint8_t code, std::string name);
  expected<void> add_entry(const std::type_info& t, entry e);

  std::unordered_map<std::type_index, entry> by_type_;          // user types
  std::unordered_map<std::uint16_t, const entry*> by_type_nr_;  // CAF's built-in numbers
  std::unordered_map<std::string, const entry*> by_name_;
  std::vector<const entry*> by_code_;
  std::vector<std::unique_ptr<entry>> builtins_;
};

/// "my_ns::point" for typeid(my_ns::point): the readable name of a C++ type.
std::string readable_type_name(const std::type_info& t);

}  // namespace troupe::actors
