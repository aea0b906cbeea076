#include <troupe/actors/message_types.hpp>

#include <cxxabi.h>

#include <caf/atom.hpp>
#include <caf/type_nr.hpp>
#include <cstdlib>
#include <map>
#include <memory>

#include <troupe/core/error.hpp>

namespace troupe::actors {

std::string readable_type_name(const std::type_info& t) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(t.name(), nullptr, nullptr, &status),
                                           std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(t.name());
}

template <class T>
void message_types::add_builtin(std::uint8_t code, std::string name) {
  auto e = std::make_unique<entry>();
  e->name = std::move(name);
  e->code = code;
  e->save = [](const void* p, rpc::binary_serializer& f) -> expected<void> {
    if (auto r = f(*static_cast<const T*>(p))) return r.err();
    return ok();
  };
  e->load = [](rpc::binary_deserializer& f, caf::message_builder& mb) -> expected<void> {
    T x{};
    if (auto r = f(x)) return r.err();
    mb.append(std::move(x));
    return ok();
  };
  if (by_code_.size() <= code) by_code_.resize(code + 1u, nullptr);
  by_code_[code] = e.get();
  by_type_nr_[caf::type_nr<T>::value] = e.get();
  by_name_[e->name] = e.get();
  builtins_.push_back(std::move(e));
}

message_types::message_types() {
  // Codes are part of the byte form: append, never renumber.
  add_builtin<caf::atom_value>(1, "@atom");
  add_builtin<bool>(2, "@bool");
  add_builtin<std::int8_t>(3, "@i8");
  add_builtin<std::int16_t>(4, "@i16");
  add_builtin<std::int32_t>(5, "@i32");
  add_builtin<std::int64_t>(6, "@i64");
  add_builtin<std::uint8_t>(7, "@u8");
  add_builtin<std::uint16_t>(8, "@u16");
  add_builtin<std::uint32_t>(9, "@u32");
  add_builtin<std::uint64_t>(10, "@u64");
  add_builtin<float>(11, "@float");
  add_builtin<double>(12, "@double");
  add_builtin<std::string>(13, "@str");
  add_builtin<std::vector<std::string>>(14, "@strvec");
  add_builtin<std::map<std::string, std::string>>(15, "@strmap");
}

expected<void> message_types::add_entry(const std::type_info& t, entry e) {
  std::type_index type(t);
  if (e.name.empty())
    return make_error(errc::invalid_argument, "message type ", readable_type_name(t),
                      " needs a non-empty name");
  if (e.name.front() == '@')
    return make_error(errc::invalid_argument, "message type name '", e.name,
                      "' starts with '@', which is reserved for built-in types");
  if (auto it = by_type_.find(type); it != by_type_.end()) {
    if (it->second.name == e.name) return ok();  // the same registration twice is harmless
    return make_error(errc::invalid_argument, "message type ", readable_type_name(t),
                      " is already registered as '", it->second.name, "'; cannot also name it '",
                      e.name, "'");
  }
  if (auto it = by_name_.find(e.name); it != by_name_.end())
    return make_error(errc::invalid_argument, "the message type name '", e.name,
                      "' is already taken by another type; pick a unique name per type");
  auto [it, inserted] = by_type_.emplace(type, std::move(e));
  by_name_[it->second.name] = &it->second;
  return ok();
}

expected<void> message_types::encode(const caf::message& m, bytes& out,
                                     std::vector<tensor>* tensors) const {
  if (m.size() > 0xffff)
    return make_error(errc::invalid_argument, "a message of ", m.size(),
                      " elements; remote messages carry at most 65535");
  rpc::binary_serializer f(out, tensors);
  auto count = static_cast<std::uint16_t>(m.size());
  f.write_raw(&count, sizeof count);
  for (std::size_t i = 0; i < m.size(); ++i) {
    auto rtti = m.type(i);
    const entry* e = nullptr;
    if (rtti.first != 0) {
      if (auto it = by_type_nr_.find(rtti.first); it != by_type_nr_.end()) e = it->second;
    } else if (rtti.second != nullptr) {
      if (auto it = by_type_.find(std::type_index(*rtti.second)); it != by_type_.end())
        e = &it->second;
    }
    if (e == nullptr) {
      std::string what = rtti.second ? readable_type_name(*rtti.second)
                                     : "CAF built-in type #" + std::to_string(rtti.first);
      return make_error(
          errc::unsupported, "message element ", i, " has type ", what,
          ", which is not registered for remote messages; register it on every "
          "worker with add_message_type<T>(\"name\") and give it an inspect overload");
    }
    f.write_raw(&e->code, 1);
    if (e->code == 0) {
      if (auto r = f(e->name)) return r.err();
    }
    TROUPE_TRY(e->save(m.at(i), f));
  }
  return ok();
}

expected<caf::message> message_types::decode(std::span<const std::byte> in,
                                             std::vector<tensor>* tensors) const {
  rpc::binary_deserializer f(in, tensors);
  std::uint16_t count = 0;
  if (auto r = f.read_raw(&count, sizeof count, "element count")) return r.err();
  caf::message_builder mb;
  for (std::uint16_t i = 0; i < count; ++i) {
    std::uint8_t code = 0;
    if (auto r = f.read_raw(&code, 1, "element type")) return r.err();
    const entry* e = nullptr;
    if (code != 0) {
      if (code < by_code_.size()) e = by_code_[code];
      if (e == nullptr)
        return make_error(errc::protocol_error, "message element ", i,
                          " has unknown built-in type code ", int(code));
    } else {
      std::string name;
      if (auto r = f(name)) return r.err();
      auto it = by_name_.find(name);
      if (it == by_name_.end())
        return make_error(errc::unsupported, "message element ", i, " has type '", name,
                          "', which is not registered on this worker; register it with "
                          "add_message_type<T>(\"",
                          name, "\") on every worker");
      e = it->second;
    }
    TROUPE_TRY(e->load(f, mb));
  }
  if (f.remaining() != 0)
    return make_error(errc::protocol_error, f.remaining(), " bytes left over after a message of ",
                      count, " elements");
  return mb.move_to_message();
}

}  // namespace troupe::actors
