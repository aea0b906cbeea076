#include <troupe/collectives/nccl/unique_id.hpp>

namespace troupe::collectives {

expected<bytes> exchange_unique_id(store& s, std::string_view key, int rank, duration timeout,
                                   std::size_t id_size,
                                   const std::function<expected<bytes>()>& make) {
  if (rank == 0) {
    auto id = make();
    if (!id) return std::move(id).error();
    if (id->size() != id_size)
      return make_error(errc::internal, "the unique id made for '", key, "' has ", id->size(),
                        " bytes, not ", id_size);
    TROUPE_TRY(s.set(key, *id, timeout));
    return id;
  }
  auto id = s.get(key, timeout);
  if (!id)
    return make_error(id.error().code(), "waiting for rank 0 to publish the communicator id '", key,
                      "': ", id.error().message());
  if (id->size() != id_size)
    return make_error(errc::protocol_error, "the communicator id under '", key, "' has ",
                      id->size(), " bytes, not ", id_size, "; is another program using the key?");
  return id;
}

}  // namespace troupe::collectives
