// Open MPI alone, no shardopt: MPI_Init, a barrier, MPI_Finalize. Run by
// tests/repro/srun_init.sh, many times, as srun tasks across two nodes.
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("srun_init: %d ranks\n", size);
  MPI_Finalize();
  return 0;
}
