// Exchanging a communicator's unique id through the store: rank 0 makes it, publishes it
// under a key of the group's namespace, and every other rank reads it.
#pragma once

#include <functional>

#include <troupe/store/store.hpp>

namespace troupe::collectives {

/// Rank 0 calls `make` and sets `key`; the others wait for `key` up to `timeout`.
/// A value of the wrong size is a protocol_error.
expected<bytes> exchange_unique_id(store& s, std::string_view key, int rank, duration timeout,
                                   std::size_t id_size,
                                   const std::function<expected<bytes>()>& make);

}  // namespace troupe::collectives
