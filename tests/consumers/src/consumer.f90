! A Fortran program built against the installed shardopt, as a user's code
! is: a ZeRO optimizer (stage 2) over two arrays through the shardopt
! module, a few SGD steps (momentum and weight decay) on gradients known in
! advance, and the result compared with the same update computed here in
! double precision. Exits non-zero on any failure (the module stops the
! program) or mismatch, on every rank.
program consumer
  use, intrinsic :: iso_c_binding, only: c_float, c_int64_t
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi_f08
  use shardopt
  implicit none
  integer, parameter :: nw = 37, nb = 5, nall = nw + nb, nsteps = 4
  double precision, parameter :: lr = 0.1d0, momentum = 0.9d0, weight_decay = 0.01d0
  real(c_float), target :: w(nw), b(nb), dw(nw), db(nb)
  double precision :: ref(nall), buf(nall), g, got
  type(shardopt_comm) :: comm
  type(shardopt_params) :: params
  type(shardopt_optimizer) :: opt
  integer :: rank, nranks, step, i, r, bad, anybad
  integer(c_int64_t) :: steps

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  do i = 1, nall
    ref(i) = 0.5d0 - 0.01d0*(i - 1)
  end do
  buf = 0
  w = real(ref(1:nw), c_float)
  b = real(ref(nw + 1:nall), c_float)

  call shardopt_comm_create(MPI_COMM_WORLD, comm)
  call shardopt_params_add(params, 'w', w, dw)
  call shardopt_params_add(params, 'b', b, db)
  call shardopt_optimizer_create(comm, params, 'sgd lr=0.1 momentum=0.9 weight_decay=0.01', opt, &
                                 stage=2)
  do step = 0, nsteps - 1
    call shardopt_zero_grad(opt)
    do i = 1, nw
      dw(i) = real(grad_of(i - 1, step, rank), c_float)
    end do
    do i = 1, nb
      db(i) = real(grad_of(nw + i - 1, step, rank), c_float)
    end do
    call shardopt_grad_ready(opt, 2)
    call shardopt_grad_ready(opt, 1)
    call shardopt_step(opt)
    ! torch.optim.SGD: g += wd p; buf = g (first step), mu buf + g; p -= lr buf.
    do i = 1, nall
      g = 0
      do r = 0, nranks - 1
        g = g + grad_of(i - 1, step, r)
      end do
      g = g/nranks + weight_decay*ref(i)
      if (step == 0) then
        buf(i) = g
      else
        buf(i) = momentum*buf(i) + g
      end if
      ref(i) = ref(i) - lr*buf(i)
    end do
  end do

  bad = 0
  do i = 1, nw
    call check(w(i), i)
  end do
  do i = 1, nb
    call check(b(i), nw + i)
  end do
  call shardopt_steps(opt, steps)
  if (steps /= nsteps) then
    write (error_unit, '(a,i0,a,i0)') 'consumer (Fortran): steps counted ', steps, ', expected ', nsteps
    bad = 1
  end if
  call shardopt_optimizer_destroy(opt)
  call shardopt_comm_destroy(comm)
  call MPI_Allreduce(bad, anybad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD)
  if (rank == 0 .and. anybad == 0) then
    write (*, '(a,i0,a,i0,a)') 'consumer (Fortran): ', nsteps, ' SGD steps at ', nranks, &
      ' ranks match the reference (shardopt '//shardopt_version_string()//')'
  end if
  call MPI_Finalize()
  if (anybad /= 0) error stop 1

contains

  ! Compares the optimizer's value of element i (from 1, over both arrays)
  ! with the reference; reports the first mismatch.
  subroutine check(value, i)
    real(c_float), intent(in) :: value
    integer, intent(in) :: i
    got = value
    if (bad == 0 .and. abs(got - ref(i)) > 1d-5*(1 + abs(ref(i)))) then
      write (error_unit, '(a,i0,a,i0,a,f12.8,a,f12.8)') 'consumer (Fortran): rank ', rank, &
        ': element ', i - 1, ' is ', got, ', expected ', ref(i)
      bad = 1
    end if
  end subroutine

  ! This rank's gradient of element i (from 0, over both arrays) at a step.
  double precision function grad_of(i, step, rank)
    integer, intent(in) :: i, step, rank
    grad_of = sin(0.3d0*i + step)*(rank + 1)
  end function

end program
