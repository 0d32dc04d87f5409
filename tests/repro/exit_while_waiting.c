/* Open MPI alone, no shardopt: ranks wait in a collective that one rank
 * never joins, and the job is ended from outside the collective: that rank
 * ends with a non-zero status (mode "exit": _exit(86), no MPI_Finalize, as
 * shardopt's watchdog ends a stalled rank), or it sleeps and mpirun itself
 * is sent SIGTERM (mode "hang", by exit_while_waiting.sh: a user ending a
 * hung job). mpirun is to end the job and report why; Open MPI 4.1 has been
 * seen to crash in its PMIx server instead. tests/repro/exit_while_waiting.sh
 * runs it many times and counts how mpirun ended.
 * Usage: mpirun -n 3 exit_while_waiting exit|hang SEED */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int hang = argc > 1 && strcmp(argv[1], "hang") == 0;
  srand((unsigned)(argc > 2 ? atoi(argv[2]) : 1) * 31u + (unsigned)rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    const struct timespec pause = {hang ? 3600 : 0, (long)(rand() % 300) * 1000000L};
    nanosleep(&pause, NULL);
    _exit(86); /* the watchdog's exit status */
  }
  MPI_Barrier(MPI_COMM_WORLD); /* never completes: rank 1 is gone or asleep */
  MPI_Finalize();
  return 0;
}
