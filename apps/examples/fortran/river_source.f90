! river_source: recovers where a pollutant enters a river from noisy
! concentration readings, with shardopt's sharded Adam from Fortran.
!
! The model: the steady concentration c(x) of a pollutant along a river
! section [0, 1], carried by the flow (speed v), spreading (diffusivity D)
! and decaying (rate k), fed by an unknown source q(x):
!
!     -D c''(x) + v c'(x) + k c(x) = q(x),   c(0) = 0,   c'(1) = 0,
!     q(x) = sum_j s_j phi_j(x),  j = 1..NB,
!
! phi_j the piecewise-linear hat functions centred at x = j / NB. The NB
! coefficients s_j are unknown. NOBS sensors at random places read c plus
! noise; each MPI rank holds every size-th reading. The coefficients are
! fitted by minimizing the misfit
!
!     J(s) = 1/2 sum_i (c(x_i) - d_i)**2
!
! with Adam: each rank solves the transport equation by finite differences
! for the current s, computes its readings' residuals, and gets their
! gradient with respect to s from one adjoint (transposed) solve. shardopt
! sums the ranks' gradients (reduce_sum) and updates the coefficients,
! sharded over the ranks at stages 1 and 2, so that every rank holds the
! same s after each step. The learning rate follows a cosine schedule.
!
! Usage: mpirun -n RANKS river_source STAGE STEPS OUTPUT
!   STAGE   0, 1 or 2: the ZeRO stage
!   STEPS   optimizer steps (400 reach the threshold)
!   OUTPUT  file for the recovered coefficients, one per line
! Prints one line with the final misfit and the coefficients' relative
! error, and exits 0 if that error is below 0.03, 1 if not, 2 on bad
! arguments. A failing shardopt call stops the program with its message.
program river_source
  use, intrinsic :: iso_c_binding, only: c_float, c_double
  use mpi_f08
  use shardopt
  implicit none

  integer, parameter :: dp = c_double
  integer, parameter :: NX = 1000      ! grid intervals; c is unknown at x_1 .. x_NX
  integer, parameter :: NB = 200       ! source coefficients
  integer, parameter :: NOBS = 4096    ! sensors, over all ranks
  real(dp), parameter :: D = 2.0e-5_dp, V = 1.0e-2_dp, K = 1.0_dp
  real(dp), parameter :: NOISE = 0.01_dp      ! sensor noise, relative to the RMS concentration
  real(dp), parameter :: THRESHOLD = 0.03_dp  ! relative error of the coefficients to reach
  real(dp), parameter :: LR = 0.05_dp
  real(dp), parameter :: PI = 3.14159265358979323846_dp

  ! The tridiagonal transport matrix (rows 1..NX): lower, diagonal, upper.
  real(dp) :: lo(NX), di(NX), up(NX)
  ! This rank's sensors: places, readings, and their grid cells.
  real(dp), allocatable :: xs(:), ds(:)
  real(c_float), target :: s(NB)          ! the coefficients the optimizer updates
  real(c_float) :: grad(NB)
  real(dp) :: s_true(NB), conc(NX), misfit, total, err, rms
  integer :: rank, nranks, stage, nsteps, step, j, nlocal, u, status
  type(shardopt_comm) :: comm
  type(shardopt_params) :: params
  type(shardopt_optimizer) :: opt
  character(len=256) :: output

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call read_arguments(stage, nsteps, output, status)
  if (status /= 0) then
    if (rank == 0) write (*, '(a)') 'usage: river_source STAGE STEPS OUTPUT  (STAGE 0, 1 or 2; STEPS >= 1)'
    call MPI_Finalize()
    stop 2
  end if

  call build_matrix()
  do j = 1, NB
    s_true(j) = source(real(j, dp)/NB)
  end do
  call make_readings()

  ! The optimizer: one parameter, the coefficients, from 0; the ranks'
  ! gradients are summed (each rank's is its own readings' share of J's).
  s = 0
  call shardopt_comm_create(MPI_COMM_WORLD, comm)
  call shardopt_params_add(params, 'source', s)
  call shardopt_optimizer_create(comm, params, 'adam lr=0.05 betas=0.9,0.999', opt, stage=stage, reduce_sum=.true.)

  do step = 1, nsteps
    call shardopt_set_lr(opt, LR*0.5_dp*(1 + cos(PI*(step - 1)/nsteps)))
    call shardopt_zero_grad(opt)
    call misfit_gradient(real(s, dp), misfit, grad)
    call shardopt_grad_ready(opt, 1, grad)
    call shardopt_step(opt)
  end do

  ! The final misfit over all readings, and the coefficients' error.
  call misfit_gradient(real(s, dp), misfit, grad)
  call MPI_Allreduce(misfit, total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  err = sqrt(sum((real(s, dp) - s_true)**2)/sum(s_true**2))
  if (rank == 0) then
    open (newunit=u, file=trim(output), status='replace', action='write')
    do j = 1, NB
      write (u, '(i4,1x,es16.8e2)') j, s(j)
    end do
    close (u)
    call solve(nodal_source(s_true), conc)
    rms = sqrt(sum(conc**2)/NX)
    write (*, '(a,i0,a,i0,a,i0,a,es10.3,a,es10.3,a,f7.4,a,f5.3,a)') 'river_source: ', nranks, ' ranks, stage ', &
      stage, ', ', nsteps, ' steps: misfit ', total, ' (noise level ', 0.5_dp*NOBS*(NOISE*rms)**2, &
      '), relative error ', err, ' (threshold ', THRESHOLD, ') '//trim(merge('reached    ', 'NOT reached', &
                                                                                err < THRESHOLD))
  end if

  call shardopt_optimizer_destroy(opt)
  call shardopt_comm_destroy(comm)
  call MPI_Finalize()
  if (.not. err < THRESHOLD) stop 1

contains

  subroutine read_arguments(stage, nsteps, output, status)
    integer, intent(out) :: stage, nsteps, status
    character(len=*), intent(out) :: output
    character(len=32) :: a
    integer :: ios
    status = 1
    stage = -1
    nsteps = 0
    output = ''
    if (command_argument_count() /= 3) return
    call get_command_argument(1, a)
    read (a, *, iostat=ios) stage
    if (ios /= 0 .or. stage < 0 .or. stage > 2) return
    call get_command_argument(2, a)
    read (a, *, iostat=ios) nsteps
    if (ios /= 0 .or. nsteps < 1) return
    call get_command_argument(3, output)
    if (len_trim(output) == 0) return
    status = 0
  end subroutine

  ! The true source: a background, a smooth wave, a narrow outfall and a
  ! stretch of contaminated bank.
  function source(x) result(q)
    real(dp), intent(in) :: x
    real(dp) :: q
    q = 1 + 0.5_dp*sin(6*PI*x) + 0.8_dp*exp(-((x - 0.3_dp)/0.03_dp)**2)
    if (x > 0.6_dp .and. x < 0.75_dp) q = q + 0.6_dp
  end function

  ! Central differences, h = 1/NX; the outflow condition c'(1) = 0 through
  ! a ghost node c(NX+1) = c(NX-1).
  subroutine build_matrix()
    real(dp) :: h
    h = 1.0_dp/NX
    lo = -D/h**2 - V/(2*h)
    di = 2*D/h**2 + K
    up = -D/h**2 + V/(2*h)
    lo(1) = 0
    lo(NX) = -2*D/h**2
    up(NX) = 0
  end subroutine

  ! Solves the tridiagonal system (l, dg, u) x = b (Thomas algorithm).
  subroutine solve_with(l, dg, u, b, x)
    real(dp), intent(in) :: l(NX), dg(NX), u(NX), b(NX)
    real(dp), intent(out) :: x(NX)
    real(dp) :: c(NX), r(NX), m
    integer :: i
    c(1) = u(1)/dg(1)
    r(1) = b(1)/dg(1)
    do i = 2, NX
      m = dg(i) - l(i)*c(i - 1)
      c(i) = u(i)/m
      r(i) = (b(i) - l(i)*r(i - 1))/m
    end do
    x(NX) = r(NX)
    do i = NX - 1, 1, -1
      x(i) = r(i) - c(i)*x(i + 1)
    end do
  end subroutine

  subroutine solve(b, x)
    real(dp), intent(in) :: b(NX)
    real(dp), intent(out) :: x(NX)
    call solve_with(lo, di, up, b, x)
  end subroutine

  ! The transposed matrix: row i's lower entry is row i-1's upper one.
  subroutine solve_transposed(b, x)
    real(dp), intent(in) :: b(NX)
    real(dp), intent(out) :: x(NX)
    real(dp) :: lt(NX), ut(NX)
    lt(1) = 0
    lt(2:NX) = up(1:NX - 1)
    ut(1:NX - 1) = lo(2:NX)
    ut(NX) = 0
    call solve_with(lt, di, ut, b, x)
  end subroutine

  ! The source at the grid nodes x_i = i/NX: sum_j s_j phi_j(x_i).
  function nodal_source(coef) result(q)
    real(dp), intent(in) :: coef(NB)
    real(dp) :: q(NX)
    integer :: i
    do i = 1, NX
      q(i) = hats(coef, real(i, dp)/NX)
    end do
  end function

  ! sum_j v_j phi_j(x), j = 1..n = size(v), phi_j the hat function centred
  ! at j/n: the piecewise-linear function through (0, 0) and the points
  ! (j/n, v_j). It gives the source from its coefficients (v = coef, n = NB)
  ! and the concentration between the grid nodes (v = c, n = NX).
  function hats(v, x) result(value)
    real(dp), intent(in) :: v(:), x
    real(dp) :: value, t
    integer :: n, j
    n = size(v)
    j = min(int(x*n), n - 1)
    t = x*n - j
    value = t*v(j + 1)
    if (j >= 1) value = value + (1 - t)*v(j)
  end function

  ! This rank's readings: sensors rank+1, rank+1+size, ... of NOBS, at
  ! random places, reading the true concentration plus Gaussian noise. Every
  ! rank draws all NOBS sensors from one seed, so that the readings are the
  ! same at any rank count.
  subroutine make_readings()
    real(dp) :: c(NX), rms, g
    real(dp), allocatable :: u(:, :)
    integer :: i, n, nseed
    integer, allocatable :: seed(:)
    allocate (u(NOBS, 3))
    call random_seed(size=nseed)
    allocate (seed(nseed))
    seed = [(104729*i + 12345, i=1, nseed)]
    call random_seed(put=seed)
    call random_number(u)
    call solve(nodal_source(s_true), c)
    rms = sqrt(sum(c**2)/NX)
    nlocal = (NOBS - rank + nranks - 1)/nranks
    allocate (xs(nlocal), ds(nlocal))
    n = 0
    do i = rank + 1, NOBS, nranks
      n = n + 1
      xs(n) = 0.001_dp + 0.998_dp*u(i, 1)
      g = sqrt(-2*log(1 - u(i, 2)))*cos(2*PI*u(i, 3))
      ds(n) = hats(c, xs(n)) + NOISE*rms*g
    end do
  end subroutine

  ! This rank's share of J and of its gradient: the forward solve, the
  ! residuals at the sensors spread back onto the grid, one transposed
  ! solve, and the hat functions' sums of the adjoint.
  subroutine misfit_gradient(coef, misfit, grad)
    real(dp), intent(in) :: coef(NB)
    real(dp), intent(out) :: misfit
    real(c_float), intent(out) :: grad(NB)
    real(dp) :: c(NX), rhs(NX), adj(NX), g(NB), r, t
    integer :: n, i, j
    call solve(nodal_source(coef), c)
    rhs = 0
    misfit = 0
    do n = 1, nlocal
      r = hats(c, xs(n)) - ds(n)
      misfit = misfit + 0.5_dp*r**2
      i = min(int(xs(n)*NX), NX - 1)
      t = xs(n)*NX - i
      rhs(i + 1) = rhs(i + 1) + t*r
      if (i >= 1) rhs(i) = rhs(i) + (1 - t)*r
    end do
    call solve_transposed(rhs, adj)
    g = 0
    do i = 1, NX
      j = min(int(real(i, dp)/NX*NB), NB - 1)
      t = real(i, dp)/NX*NB - j
      g(j + 1) = g(j + 1) + t*adj(i)
      if (j >= 1) g(j) = g(j) + (1 - t)*adj(i)
    end do
    grad = real(g, c_float)
  end subroutine

end program river_source
