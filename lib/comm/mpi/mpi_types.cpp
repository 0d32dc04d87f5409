#include "comm/mpi/mpi_types.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <type_traits>

#include "common/check.hpp"
#include "common/mpi_lifetime.hpp"
#include "kernels/reduce.hpp"

namespace shardopt::detail {

namespace {

// MPI's user function for `T` reduced with `Op`: the kernel that combines
// two buffers (kernels/reduce.hpp).
template <DType T, ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::cpu::combine_pair(T, Op, in, inout, *len);
}

// Index: [is_f16][sum, max, min]
MPI_Op g_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                      {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
std::once_flag g_ops_once;

void free_ops() {
  for (auto& row : g_ops)
    for (auto& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
}

void create_ops() {
  MPI_User_function* fns[2][3] = {
      {&half_op<DType::bf16, ReduceOp::sum>, &half_op<DType::bf16, ReduceOp::max>,
       &half_op<DType::bf16, ReduceOp::min>},
      {&half_op<DType::f16, ReduceOp::sum>, &half_op<DType::f16, ReduceOp::max>,
       &half_op<DType::f16, ReduceOp::min>}};
  for (int t = 0; t < 2; ++t)
    for (int o = 0; o < 3; ++o)
      SHARDOPT_CHECK_MPI(MPI_Op_create(fns[t][o], /*commute=*/1, &g_ops[t][o]),
                         "creating the bf16/f16 reduction ops");
  at_mpi_finalize(free_ops);  // MPI releases nothing by itself
}

}  // namespace

MPI_Op mpi_op(DType t, ReduceOp op) {
  const int o = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;  // avg reduces as sum
  if (t == DType::bf16 || t == DType::f16) {
    std::call_once(g_ops_once, create_ops);
    return g_ops[t == DType::f16 ? 1 : 0][o];
  }
  return o == 1 ? MPI_MAX : o == 2 ? MPI_MIN : MPI_SUM;
}

void divide_elements(void* buf, std::size_t count, DType t, int divisor) noexcept {
  switch (t) {
    case DType::f32: {
      auto* x = static_cast<float*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] /= d;
      break;
    }
    case DType::f64: {
      auto* x = static_cast<double*>(buf);
      const double d = divisor;
      for (std::size_t i = 0; i < count; ++i) x[i] /= d;
      break;
    }
    case DType::bf16: {
      auto* x = static_cast<bfloat16*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] = bf16_from_float(to_float(x[i]) / d);
      break;
    }
    case DType::f16: {
      auto* x = static_cast<float16*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] = f16_from_float(to_float(x[i]) / d);
      break;
    }
    default:
      break;  // integers never reach here: avg of integers is rejected up front
  }
}

}  // namespace shardopt::detail
