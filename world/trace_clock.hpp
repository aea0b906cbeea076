// trace_clock: the trace's clock offset of a job without an RPC agent (whose agent measures
// by ping itself, docs/tracing.md), measured through the job's store. Internal to world/.
#pragma once

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe::detail {

/// Rank 0 answers `samples` pings of every other rank, rank by rank, with its clock
/// (keys under "troupe/trace-clock/"); each other rank keeps its fastest sample and records
/// the offset and half that round trip with trace::set_clock. Rank 0 records itself as the
/// reference. Every wait is bounded by `until`; the error says which rank or key timed out.
expected<void> measure_trace_clock(store& s, int rank, int size, int samples, deadline until);

}  // namespace troupe::detail
