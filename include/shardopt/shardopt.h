/* shardopt: the C umbrella header. The C API returns shardopt_status_t
 * codes; it grows with the library (see docs/). */
#ifndef SHARDOPT_H
#define SHARDOPT_H

#include "shardopt/status.h"

#endif /* SHARDOPT_H */
