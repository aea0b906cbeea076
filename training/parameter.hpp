// parameter: one trainable tensor as the training layer sees it: the weights and the
// gradient buffer, both non-owning views into the model's own memory (any framework's).
#pragma once

#include <string>
#include <vector>

#include <troupe/collectives/tensor.hpp>

namespace troupe::training {

struct parameter {
  /// For messages, e.g. "layer1.weight".
  std::string name;
  /// The weights; the strategy reads and writes them (initial broadcast, averaging).
  tensor_view value;
  /// The gradient; same dtype, element count and device as `value`.
  tensor_view grad;
};

/// Checks one parameter list: each entry has a name, value and grad agree in dtype,
/// element count and device, data is non-null unless empty, and the dtype is floating.
/// The error names the offending parameter and what to fix.
expected<void> check_parameters(const std::vector<parameter>& params);

}  // namespace troupe::training
