// worker_device_info: what each worker tells the group about its devices at init time,
// and its binary form for exchange through a store.
#pragma once

#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/device.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/devicemap/device_map.hpp>

namespace troupe {

/// One worker's device record.
struct worker_device_info {
  /// The worker's name, unique in its group.
  std::string name;
  /// How many CUDA devices the worker sees; cuda:i is valid iff 0 <= i < device_count.
  int device_count = 0;
  /// The worker's device maps, keyed by target worker name.
  device_maps maps;
  /// The devices the worker was told to use; empty means "not given, derive it".
  std::vector<device> devices;

  friend bool operator==(const worker_device_info&, const worker_device_info&) = default;
};

/// "worker 'w0' (device count 2, devices [cuda:0], maps {w1: {cuda:0 -> cuda:1}})".
std::ostream& operator<<(std::ostream& os, const worker_device_info& info);

/// Appends the binary form of `info` to `out`. Layout (integers little-endian; a string
/// is a u32 length then its bytes):
///   u8  version (1)
///   str name
///   i32 device_count
///   u32 number of targets, then per target in name order:
///       str target name, u32 number of entries, then per entry in source order:
///       device source, device target
///   u32 number of listed devices, then each device in list order
/// A device is a u8 type (0 = cpu, 1 = cuda), followed for cuda by an i32 index.
void encode(const worker_device_info& info, bytes& out);

/// The binary form of `info` as a fresh buffer.
bytes encode(const worker_device_info& info);

/// Reads a record written by `encode`. The input must hold exactly one record. Any
/// malformed input (truncated, unknown version or device type, negative index or count,
/// a repeated target name, a source mapped twice, trailing bytes) is an
/// errc::protocol_error naming the field being read.
expected<worker_device_info> decode_worker_device_info(std::span<const std::byte> data);

}  // namespace troupe
