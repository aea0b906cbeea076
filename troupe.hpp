// <troupe/troupe.hpp>: the whole library but the CAF actors, for programs that would rather
// include one header than pick the modules (each module's headers are also installed on
// their own, as <troupe/module/header.hpp>). The actors need CAF: include
// <troupe/actors/node.hpp> and <troupe/actors/system.hpp> for them.
#pragma once

#include "collectives/group.hpp"
#include "collectives/join.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/expected.hpp"
#include "core/future.hpp"
#include "core/log.hpp"
#include "core/tensor.hpp"
#include "core/time.hpp"
#include "devicemap/device_map.hpp"
#include "membership/service.hpp"
#include "rpc/backend_registry.hpp"
#include "store/connect.hpp"
#include "store/store.hpp"
#include "training/ddp.hpp"
#include "training/elastic_loop.hpp"
#include "training/strategy_registry.hpp"
#include "world/world.hpp"
