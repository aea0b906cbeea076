// The "gloo" backend: CPU tensors over Gloo's TCP transport. Internal to collectives/.
#pragma once

#include <troupe/collectives/registry.hpp>

namespace troupe::collectives {

/// The registry entry of the gloo backend.
backend_info gloo_backend_info();

}  // namespace troupe::collectives
