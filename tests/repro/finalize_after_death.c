/* Open MPI alone, no shardopt: a rank dies (_exit, no MPI_Finalize) while
 * the job runs with orte_abort_on_non_zero_status 0, and the survivors, a
 * moment later, call MPI_Finalize. Now and then MPI_Finalize never
 * returns: the survivors wait in its fence for the dead rank (seen with
 * Open MPI 4.1.4, stacks in ompi_mpi_finalize's usleep / sched_yield loop).
 * tests/repro/finalize_after_death.sh runs it many times and counts the
 * hangs. Usage: mpirun -n 3 --mca orte_abort_on_non_zero_status 0
 * finalize_after_death SEED */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  srand((unsigned)(argc > 1 ? atoi(argv[1]) : 1) * 31u + (unsigned)rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) _exit(9); /* dies without a word to MPI */
  /* The survivors notice it after a while (shardopt's shared-memory
   * transport looks every second), then end normally. */
  const struct timespec pause = {0, (long)(rand() % 1500) * 1000000L};
  nanosleep(&pause, NULL);
  fprintf(stderr, "rank %d: finalizing\n", rank);
  MPI_Finalize();
  fprintf(stderr, "rank %d: finalized\n", rank);
  return 0;
}
