// Rendezvous helpers over any store: all_gather and a reusable barrier. Every wait is
// bounded by the timeout given, and a timeout names the ranks that did not show up.
#pragma once

#include <string_view>
#include <vector>

#include <troupe/store/store.hpp>

namespace troupe {

/// Publishes `mine` as rank `rank` of `world_size` under `key_prefix`, waits for every
/// rank's value and returns them in rank order. Keys: "<key_prefix>/<rank>". Use a fresh
/// prefix per exchange (a round or epoch number, or a prefix_store): a second all_gather
/// under the same prefix would read the first one's values.
expected<std::vector<bytes>> all_gather(store& s, std::string_view key_prefix, int rank,
                                        int world_size, std::span<const std::byte> mine,
                                        duration timeout);

/// Returns once all `world_size` ranks have entered the barrier `name`. Reusable: the
/// n-th call on a name meets the other ranks' n-th calls (a shared arrival counter splits
/// calls into generations; the last rank to arrive opens the generation and clears the
/// one before it). A timeout names the ranks that had not arrived. After a timeout the
/// counts of that name no longer line up across ranks: use a new name.
expected<void> barrier(store& s, std::string_view name, int rank, int world_size, duration timeout);

}  // namespace troupe
