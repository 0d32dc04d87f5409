/* Open MPI alone, no shardopt: one rank ends with a non-zero status
 * (_exit, no MPI_Finalize, as shardopt's watchdog ends a stalled rank)
 * while the others wait in a collective. mpirun is to end the job and
 * report the rank; now and then it crashes instead (seen with Open MPI
 * 4.1.4: a segmentation fault of mpirun itself, in its PMIx server, after
 * it has killed the ranks). tests/repro/exit_while_waiting.sh runs it many
 * times and counts how mpirun ended. Usage: mpirun -n 3
 * exit_while_waiting SEED */
#include <mpi.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  srand((unsigned)(argc > 1 ? atoi(argv[1]) : 1) * 31u + (unsigned)rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    const struct timespec pause = {0, (long)(rand() % 300) * 1000000L};
    nanosleep(&pause, NULL);
    _exit(86); /* the watchdog's exit status */
  }
  MPI_Barrier(MPI_COMM_WORLD); /* never completes: rank 1 is gone */
  MPI_Finalize();
  return 0;
}
