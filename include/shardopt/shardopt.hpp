// shardopt: the C++ umbrella header. Includes the whole public C++ API.
#pragma once

#include "shardopt/agree.hpp"
#include "shardopt/build_info.hpp"
#include "shardopt/cast.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"
#include "shardopt/device.hpp"
#include "shardopt/environment.hpp"
#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "shardopt/lr_scheduler.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"
#include "shardopt/version.hpp"
#include "shardopt/zero.hpp"
