// shardopt internal: MPI datatypes and reduction ops for shardopt's types.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "kernels/reduce.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

// The MPI datatype that carries `t`. bf16 and f16 travel as MPI_UINT16_T and
// are only ever reduced with shardopt's own ops (mpi_op).
inline MPI_Datatype mpi_datatype(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::f16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// The MPI op that reduces `t` with `op` (avg reduces with the sum; the
// division follows locally). For bf16 and f16 these are user-defined ops that
// convert to f32, combine and round once to the 16-bit type. Needs MPI
// running; the user-defined ops are created at the first call and freed by
// MPI_Finalize.
MPI_Op mpi_op(DType t, ReduceOp op);

// The vector paths of the bf16/f16 ops (the kernel's, combine_pair),
// narrowest first. half_op_widest() is the widest this CPU runs;
// limit_half_ops(p) makes the ops use no path wider than p (tests run every
// path a machine has: each gives the same bits as the scalar loop).
using HalfOpPath = kernels::cpu::PairPath;
inline HalfOpPath half_op_widest() noexcept { return kernels::cpu::pair_path_widest(); }
inline void limit_half_ops(HalfOpPath widest) noexcept { kernels::cpu::limit_pair_path(widest); }

// buf[i] /= divisor for i < count, in the arithmetic of `t` (f32 and f64
// divide in their own precision; bf16 and f16 divide in f32, round once).
void divide_elements(void* buf, std::size_t count, DType t, int divisor) noexcept;

}  // namespace shardopt::detail
