/* shardopt: symbol visibility for the shared library. */
#ifndef SHARDOPT_EXPORT_H
#define SHARDOPT_EXPORT_H

#if defined(SHARDOPT_BUILDING_LIBRARY) && defined(__GNUC__)
#define SHARDOPT_API __attribute__((visibility("default")))
#else
#define SHARDOPT_API
#endif

#endif /* SHARDOPT_EXPORT_H */
