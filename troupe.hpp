// <troupe/troupe.hpp>: the whole library but the CAF actors, for programs that would rather
// include one header than pick the modules (each module's headers are also installed on
// their own, as <troupe/module/header.hpp>). The actors need CAF: include
// <troupe/actors/node.hpp> and <troupe/actors/system.hpp> for them.
#pragma once

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/join.hpp>
#include <troupe/core/device.hpp>
#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/future.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/tensor.hpp>
#include <troupe/core/time.hpp>
#include <troupe/devicemap/device_map.hpp>
#include <troupe/membership/service.hpp>
#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/store.hpp>
#include <troupe/training/ddp.hpp>
#include <troupe/training/elastic_loop.hpp>
#include <troupe/training/strategy_registry.hpp>
#include <troupe/world/world.hpp>
