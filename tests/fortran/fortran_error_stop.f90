! A failing call without ierr stops the program with the message and its
! hint, on the failing rank (the last one): `module` passes a gradient of
! the wrong size (found by the module), `capi` an unknown hyper-parameter
! (found by the C API). `agreed`: the last rank registers a parameter of
! another size, which every rank's optimizer_create refuses alike; one rank
! prints it, naming the parameter as Fortran numbers it (parameter 1). run_error_stop.sh runs it and checks the output.
program fortran_error_stop
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use shardopt
  implicit none
  real(c_float), target :: w(10)
  real(c_float) :: g(9)
  type(shardopt_comm) :: comm
  type(shardopt_params) :: params
  type(shardopt_optimizer) :: opt
  character(len=16) :: mode
  integer :: rank, nranks

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call get_command_argument(1, mode)
  w = 1
  g = 1
  call shardopt_comm_create(MPI_COMM_WORLD, comm)
  if (mode == 'agreed' .and. rank == nranks - 1) then
    call shardopt_params_add(params, 'w', w(1:9))
  else
    call shardopt_params_add(params, 'w', w)
  end if
  call shardopt_optimizer_create(comm, params, 'sgd lr=0.1', opt)
  if (rank == nranks - 1) then
    if (mode == 'module') then
      call shardopt_grad_ready(opt, 1, g)
    else
      call shardopt_set_hparams(opt, 'bogus=1')
    end if
  end if
  write (*, '(a,i0,a)') 'rank ', rank, ' went on'
  flush (6)
  call MPI_Barrier(MPI_COMM_WORLD)
  call shardopt_optimizer_destroy(opt)
  call shardopt_comm_destroy(comm)
  call MPI_Finalize()
  write (*, '(a)') 'the job finished'
end program fortran_error_stop
