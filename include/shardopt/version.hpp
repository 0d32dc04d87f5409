// shardopt: version of the headers (the macros of shardopt/version.h).
#pragma once

#include "shardopt/version.h"
