// shardopt kernels: the element-wise reductions of the collectives: of the
// shared-memory transport (lib/comm/shm/) and of the ZeRO engine's fused
// reduce-scatter + update, which must give bitwise what the collective
// gives (reduce_arrays); and MPI's reduction ops for bf16 and f16
// (combine_pair). Unlike MPI's reduction ops, which
// combine two buffers at a time, these combine every rank's buffer in one pass, in rank order, so
// the result of a sum depends on nothing but the inputs and their order.
#pragma once

#include <cstddef>

#include "shardopt/types.hpp"

namespace shardopt::kernels::cpu {

// dst[i] = src[0][i] op src[1][i] op ... op src[n - 1][i], combined left to
// right: in the type's own arithmetic for f32, f64, i32 and i64; in f32 for
// bf16 and f16, rounded once to the 16-bit type at the end. max and min let
// a NaN win (as torch.maximum). avg divides the sum by `n` (in f32 for the
// 16-bit types, before the one rounding). dst may not overlap any source.
// Chooses AVX2 where the CPU has it (one binary for every node).
// stream: write dst with non-temporal stores (past the caches: for outputs
// too large to stay there, whose lines need not be read first).
void reduce_arrays(DType t, ReduceOp op, const void* const* src, int n, void* dst,
                   std::size_t count, bool stream = false) noexcept;

// memcpy, or with stream non-temporal stores (as above). Either way
// complete, and ordered before later stores, on return.
void copy_bytes(void* dst, const void* src, std::size_t bytes, bool stream) noexcept;

// The vector paths of combine_pair, narrowest first. pair_path_widest() is
// the widest this CPU runs; limit_pair_path(p) makes combine_pair use no
// path wider than p (tests run every path a machine has: each gives the
// bits of the scalar loop).
enum class PairPath { scalar, avx2, avx512, avx512bf16 };
PairPath pair_path_widest() noexcept;
void limit_pair_path(PairPath widest) noexcept;

// inout[i] = in[i] op inout[i] for i < len, for bf16 (t) or f16: each in
// f32, rounded once to nearest even back to the 16-bit type; max and min
// let a NaN win; any other op sums. Two buffers at a time: the operation
// MPI's user-defined reduction ops perform (lib/comm/mpi/mpi_types.cpp).
void combine_pair(DType t, ReduceOp op, const void* in, void* inout, int len) noexcept;

}  // namespace shardopt::kernels::cpu
