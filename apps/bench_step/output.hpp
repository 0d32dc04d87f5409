// shardopt-bench-step: what rank 0 prints: the header, a table line or a
// JSON object per row, and the goals.
#pragma once

#include <vector>

#include "bench.hpp"
#include "options.hpp"

namespace bench_step {

void print_header(const Options& o, const Bench& bench, int nranks, int local_ranks);
void print_row(const Options& o, const Row& r, double bucket_mb);
void print_goals(const Options& o, const std::vector<Row>& rows);

}  // namespace bench_step
