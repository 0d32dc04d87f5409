! What the Fortran test programs share: checks that count failures, one
! verdict for all ranks, deterministic per-rank data, and bitwise
! comparisons of real arrays.
module ftest
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int32_t, c_int64_t
  use, intrinsic :: iso_fortran_env, only: output_unit
  use mpi_f08
  implicit none
  private
  public :: test_init, test_finish, check, check_close, check_status, check_fails, check_fortran_words
  public :: same_bits, uval, grid
  public :: world_rank, world_size

  integer :: world_rank = 0, world_size = 1
  integer :: checks = 0, failures = 0

contains

  subroutine test_init()
    call MPI_Init()
    call MPI_Comm_rank(MPI_COMM_WORLD, world_rank)
    call MPI_Comm_size(MPI_COMM_WORLD, world_size)
  end subroutine

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (.not. ok) then
      failures = failures + 1
      write (output_unit, '(a,i0,a,a)') 'FAIL (rank ', world_rank, '): ', what
      flush (output_unit)
    end if
  end subroutine

  ! |got - want| <= atol + rtol * |want| for every element.
  subroutine check_close(got, want, rtol, atol, what)
    real(c_double), intent(in) :: got(:), want(:)
    real(c_double), intent(in) :: rtol, atol
    character(len=*), intent(in) :: what
    integer :: i, worst
    real(c_double) :: excess, e
    if (size(got) /= size(want)) then
      call check(.false., what//': sizes differ')
      return
    end if
    worst = 0
    excess = 0
    do i = 1, size(got)
      e = abs(got(i) - want(i)) - (atol + rtol*abs(want(i)))
      if (.not. (e <= 0)) then
        if (worst == 0 .or. e > excess) then
          worst = i
          excess = e
        end if
      end if
    end do
    if (worst /= 0) then
      write (output_unit, '(a,i0,a,a,a,i0,a,es24.16,a,es24.16)') 'FAIL (rank ', world_rank, '): ', what, &
        ': element ', worst, ' is ', got(worst), ', expected ', want(worst)
      flush (output_unit)
    end if
    checks = checks + 1
    if (worst /= 0) failures = failures + 1
  end subroutine

  ! The call returned `want` in ierr and its message contains `text`.
  subroutine check_status(ierr, want, message, text, what)
    integer, intent(in) :: ierr, want
    character(len=*), intent(in) :: message, text, what
    checks = checks + 1
    if (ierr /= want .or. index(message, text) == 0) then
      failures = failures + 1
      write (output_unit, '(a,i0,a,a,a,i0,a,i0,a,a,a,a,a)') 'FAIL (rank ', world_rank, '): ', what, &
        ': ierr ', ierr, ' (expected ', want, '), message "', message, '" (expected to contain "', &
        text, '")'
      flush (output_unit)
    end if
  end subroutine

  ! The call failed (any status) with a message that contains `text`.
  subroutine check_fails(ierr, message, text, what)
    integer, intent(in) :: ierr
    character(len=*), intent(in) :: message, text, what
    checks = checks + 1
    if (ierr == 0 .or. len(message) == 0 .or. index(message, text) == 0) then
      failures = failures + 1
      write (output_unit, '(a,i0,a,a,a,i0,a,a,a,a,a)') 'FAIL (rank ', world_rank, '): ', what, &
        ': ierr ', ierr, ' (expected a failure), message "', message, '" (expected to contain "', text, '")'
      flush (output_unit)
    end if
  end subroutine

  ! The call failed with a message (hint included) that speaks Fortran: it
  ! contains `text` (the module's names, parameters numbered from 1) and no
  ! C++ spelling ("ZeroOptions::stage").
  subroutine check_fortran_words(ierr, message, text, what)
    integer, intent(in) :: ierr
    character(len=*), intent(in) :: message, text, what
    checks = checks + 1
    if (ierr == 0 .or. index(message, text) == 0 .or. index(message, '::') /= 0) then
      failures = failures + 1
      write (output_unit, '(a,i0,a,a,a,i0,a,a,a,a,a)') 'FAIL (rank ', world_rank, '): ', what, &
        ': ierr ', ierr, ', message "', message, '" (expected to contain "', text, &
        '" and no C++ spelling "::")'
      flush (output_unit)
    end if
  end subroutine

  logical function same_bits(a, b)
    real(c_float), intent(in) :: a(:), b(:)
    same_bits = size(a) == size(b)
    if (same_bits) same_bits = all(transfer(a, 1_c_int32_t, size(a)) == transfer(b, 1_c_int32_t, size(b)))
  end function

  ! A value in [-1, 1) determined by four integers (rank, step, parameter,
  ! element), on a grid of 1/4096 so that it is exact in real(4) and its
  ! sums over a few ranks are exact too.
  function uval(a, b, c, d) result(v)
    integer, intent(in) :: a, b, c, d
    real(c_double) :: v
    integer(c_int64_t) :: x
    integer :: k
    x = modulo(int(a, c_int64_t)*1000003_c_int64_t + int(b, c_int64_t)*10007_c_int64_t + &
               int(c, c_int64_t)*101_c_int64_t + int(d, c_int64_t) + 12345_c_int64_t, 2147483647_c_int64_t)
    if (x == 0) x = 1
    do k = 1, 3
      x = modulo(16807_c_int64_t*x, 2147483647_c_int64_t)
    end do
    v = grid(real(x, c_double)/2147483647.0_c_double*2 - 1)
  end function

  ! v rounded down to the 1/4096 grid.
  function grid(v) result(g)
    real(c_double), intent(in) :: v
    real(c_double) :: g
    g = real(floor(v*4096), c_double)/4096
  end function

  ! Every rank's failures decide; rank 0 prints the verdict. Every rank must
  ! have checked something.
  subroutine test_finish(name)
    character(len=*), intent(in) :: name
    integer :: counts(2), totals(2), least
    counts = [failures, checks]
    call MPI_Allreduce(counts, totals, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call MPI_Allreduce(checks, least, 1, MPI_INTEGER, MPI_MIN, MPI_COMM_WORLD)
    if (world_rank == 0) then
      write (output_unit, '(a,a,i0,a,i0,a,i0,a)') name, ': ', totals(2), ' checks on ', world_size, &
        ' ranks, ', totals(1), ' failed'
      flush (output_unit)
    end if
    call MPI_Finalize()
    if (totals(1) > 0 .or. least == 0) stop 1
  end subroutine

end module ftest
