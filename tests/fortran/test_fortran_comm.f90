! The Fortran module's communicator and collectives, at any rank count:
! every collective (out of place and in place, partial counts, count 0) on
! real(4), real(8), integer(4) and integer(8) arrays against a loop over
! the ranks' known data; communicators from mpi_f08 and from an integer
! handle; and bad arguments (negative counts, arrays too small, a bad
! root, use after destroy), each reported through ierr with its message,
! the communicator still working afterwards.
program test_fortran_comm
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use shardopt
  use ftest
  implicit none
  type(shardopt_comm) :: comm
  integer :: ierr

  call test_init()
  call shardopt_comm_create(MPI_COMM_WORLD, comm, ierr=ierr)
  call check(ierr == SHARDOPT_SUCCESS, 'shardopt_comm_create from type(MPI_Comm): '//shardopt_error_message())

  call test_handles(comm)
  call test_r4(comm)
  call test_r8(comm)
  call test_i4(comm)
  call test_i8(comm)
  call test_bad_arguments(comm)
  call test_version()

  call shardopt_comm_destroy(comm, ierr)
  call check(ierr == SHARDOPT_SUCCESS, 'shardopt_comm_destroy: '//shardopt_error_message())
  call test_finish('test_fortran_comm')

contains

  ! Rank r's element i (from 1): small integers, exact in every type.
  function val(r, i) result(v)
    integer, intent(in) :: r, i
    real(c_double) :: v
    v = real(modulo((r + 1)*7 + i*3 + r*i, 23) - 11, c_double)
  end function

  ! op over the ranks of val(r, first + i - 1), i = 1..cnt, then `sentinel`
  ! up to n elements.
  function reduced(op, n, cnt, first, sentinel) result(want)
    integer, intent(in) :: op, n, cnt, first
    real(c_double), intent(in) :: sentinel
    real(c_double) :: want(n)
    integer :: i, r
    want = sentinel
    do i = 1, cnt
      want(i) = val(0, first + i - 1)
      do r = 1, world_size - 1
        select case (op)
        case (SHARDOPT_SUM, SHARDOPT_AVG)
          want(i) = want(i) + val(r, first + i - 1)
        case (SHARDOPT_MAX)
          want(i) = max(want(i), val(r, first + i - 1))
        case default
          want(i) = min(want(i), val(r, first + i - 1))
        end select
      end do
      if (op == SHARDOPT_AVG) want(i) = want(i)/world_size
    end do
  end function

  ! Rank r's block of cnt values at 0-based block b of an allgather result.
  function gathered(n, cnt, sentinel) result(want)
    integer, intent(in) :: n, cnt
    real(c_double), intent(in) :: sentinel
    real(c_double) :: want(n)
    integer :: i, r
    want = sentinel
    do r = 0, world_size - 1
      do i = 1, cnt
        want(r*cnt + i) = val(r, i)
      end do
    end do
  end function

  function op_label(op) result(s)
    integer, intent(in) :: op
    character(len=3) :: s
    select case (op)
    case (SHARDOPT_SUM)
      s = 'sum'
    case (SHARDOPT_AVG)
      s = 'avg'
    case (SHARDOPT_MAX)
      s = 'max'
    case default
      s = 'min'
    end select
  end function

  subroutine test_handles(comm)
    type(shardopt_comm), intent(in) :: comm
    type(shardopt_comm) :: from_int
    type(MPI_Comm) :: dup, shared
    integer :: rank, nranks, dup_int, result
    integer :: node, nodes, local_rank, local_ranks, shared_rank, shared_size, leader
    call shardopt_comm_rank(comm, rank, ierr)
    call check(ierr == 0 .and. rank == world_rank, 'shardopt_comm_rank is MPI''s rank')
    call shardopt_comm_size(comm, nranks, ierr)
    call check(ierr == 0 .and. nranks == world_size, 'shardopt_comm_size is MPI''s size')
    ! The node layout is MPI's: the ranks of this rank's shared-memory
    ! domain, this rank's place among them, as many nodes as domains.
    call MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, shared)
    call MPI_Comm_rank(shared, shared_rank)
    call MPI_Comm_size(shared, shared_size)
    call MPI_Comm_free(shared)
    leader = merge(1, 0, shared_rank == 0)
    call MPI_Allreduce(MPI_IN_PLACE, leader, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call shardopt_comm_node(comm, node, nodes, local_rank, local_ranks, ierr)
    call check(ierr == 0 .and. local_rank == shared_rank .and. local_ranks == shared_size .and. &
               nodes == leader .and. node >= 0 .and. node < nodes, &
               'shardopt_comm_node is MPI_COMM_TYPE_SHARED''s layout')
    ! The duplicate shardopt works on: congruent with MPI_COMM_WORLD, not it.
    call shardopt_comm_mpi(comm, dup, ierr)
    call MPI_Comm_compare(dup, MPI_COMM_WORLD, result)
    call check(ierr == 0 .and. result == MPI_CONGRUENT, 'shardopt_comm_mpi gives a duplicate of MPI_COMM_WORLD')
    call shardopt_comm_mpi(comm, dup_int, ierr)
    call check(ierr == 0 .and. dup_int == dup%MPI_VAL, 'shardopt_comm_mpi as an integer handle')
    ! The integer handle of `use mpi`.
    call shardopt_comm_create(MPI_COMM_WORLD%MPI_VAL, from_int, ierr=ierr)
    call check(ierr == 0, 'shardopt_comm_create from an integer handle: '//shardopt_error_message())
    call shardopt_comm_rank(from_int, rank, ierr)
    call check(ierr == 0 .and. rank == world_rank, 'rank of the communicator made from an integer handle')
    call shardopt_barrier(from_int, ierr)
    call check(ierr == 0, 'shardopt_barrier')
    call shardopt_comm_destroy(from_int, ierr)
    call check(ierr == 0 .and. .not. c_associated(from_int%ptr), 'shardopt_comm_destroy nulls the handle')
    ! The transport of host buffers: MPI's own collectives asked for, and a
    ! name that is not a transport refused.
    call shardopt_comm_create(MPI_COMM_WORLD, from_int, ierr=ierr, host_comm='mpi')
    call check(ierr == 0, 'shardopt_comm_create with host_comm=''mpi'': '//shardopt_error_message())
    call shardopt_barrier(from_int, ierr)
    call check(ierr == 0, 'shardopt_barrier on MPI''s collectives')
    call shardopt_comm_destroy(from_int, ierr)
    call shardopt_comm_create(MPI_COMM_WORLD, from_int, ierr=ierr, host_comm='smoke-signals')
    call check(ierr == SHARDOPT_ERR_INVALID_ARGUMENT, 'host_comm=''smoke-signals'' is refused')
    call check(index(shardopt_error_message(), 'smoke-signals') > 0, 'the error names host_comm''s value')
  end subroutine

  subroutine test_r4(comm)
    type(shardopt_comm), intent(in) :: comm
    integer, parameter :: n = 13, cnt = 11
    real(c_float) :: send(n), recv(n), buf(n)
    real(c_float), allocatable :: big(:), out(:)
    real(c_double) :: want(n)
    integer :: i, op
    do op = SHARDOPT_SUM, SHARDOPT_MIN
      send = [(real(val(world_rank, i), c_float), i=1, n)]
      recv = -99
      call shardopt_allreduce(comm, send, recv, cnt, op, ierr)
      want = reduced(op, n, cnt, 1, -99.0_c_double)
      call check(ierr == 0, 'r4 allreduce '//op_label(op)//': '//shardopt_error_message())
      call check_close(real(recv, c_double), want, 1e-6_c_double, 1e-6_c_double, 'r4 allreduce '//op_label(op))
      buf = send
      call shardopt_allreduce(comm, buf, cnt, op, ierr)
      want(cnt + 1:) = send(cnt + 1:)
      call check_close(real(buf, c_double), want, 1e-6_c_double, 1e-6_c_double, &
                       'r4 allreduce in place '//op_label(op))
    end do
    allocate (big(cnt*world_size), out(cnt*world_size + 2))
    big = [(real(val(world_rank, i), c_float), i=1, cnt*world_size)]
    recv = -99
    call shardopt_reduce_scatter(comm, big, recv, cnt, SHARDOPT_SUM, ierr)
    want = reduced(SHARDOPT_SUM, n, cnt, world_rank*cnt + 1, -99.0_c_double)
    call check_close(real(recv, c_double), want, 0.0_c_double, 0.0_c_double, 'r4 reduce_scatter')
    call shardopt_reduce_scatter(comm, big, cnt, SHARDOPT_SUM, ierr)
    call check_close(real(big(1:cnt), c_double), want(1:cnt), 0.0_c_double, 0.0_c_double, &
                     'r4 reduce_scatter in place (block at the start)')
    out = -77
    call shardopt_allgather(comm, send, out, cnt, ierr)
    call check_close(real(out, c_double), gathered(size(out), cnt, -77.0_c_double), 0.0_c_double, 0.0_c_double, &
                     'r4 allgather')
    out = -77
    out(world_rank*cnt + 1:(world_rank + 1)*cnt) = send(1:cnt)
    call shardopt_allgather(comm, out, cnt, ierr)
    call check_close(real(out, c_double), gathered(size(out), cnt, -77.0_c_double), 0.0_c_double, 0.0_c_double, &
                     'r4 allgather in place')
    buf = send
    call shardopt_broadcast(comm, buf, cnt, world_size - 1, ierr)
    want = [(val(world_size - 1, i), i=1, n)]
    want(cnt + 1:) = send(cnt + 1:)
    call check_close(real(buf, c_double), want, 0.0_c_double, 0.0_c_double, 'r4 broadcast from the last rank')
    ! Count 0: nothing moves, nothing fails.
    recv = -99
    call shardopt_allreduce(comm, send, recv, 0, SHARDOPT_SUM, ierr)
    call check(ierr == 0, 'r4 allreduce of count 0: '//shardopt_error_message())
    call check_close(real(recv, c_double), [(-99.0_c_double, i=1, n)], 0.0_c_double, 0.0_c_double, &
                     'r4 allreduce of count 0 leaves recv alone')
  end subroutine

  subroutine test_r8(comm)
    type(shardopt_comm), intent(in) :: comm
    integer, parameter :: n = 9, cnt = 9
    real(c_double) :: send(n), recv(n), buf(n), want(n)
    real(c_double), allocatable :: big(:), out(:)
    integer :: i, op
    do op = SHARDOPT_SUM, SHARDOPT_MIN
      send = [(val(world_rank, i)/3, i=1, n)]
      recv = -99
      call shardopt_allreduce(comm, send, recv, cnt, op, ierr)
      want = reduced(op, n, cnt, 1, -99.0_c_double)/3
      call check(ierr == 0, 'r8 allreduce '//op_label(op)//': '//shardopt_error_message())
      call check_close(recv, want, 1e-14_c_double, 1e-13_c_double, 'r8 allreduce '//op_label(op))
      buf = send
      call shardopt_allreduce(comm, buf, cnt, op, ierr)
      call check_close(buf, want, 1e-14_c_double, 1e-13_c_double, 'r8 allreduce in place '//op_label(op))
    end do
    allocate (big(cnt*world_size), out(cnt*world_size))
    big = [(val(world_rank, i), i=1, cnt*world_size)]
    call shardopt_reduce_scatter(comm, big, recv, cnt, SHARDOPT_MAX, ierr)
    call check_close(recv, reduced(SHARDOPT_MAX, n, cnt, world_rank*cnt + 1, 0.0_c_double), 0.0_c_double, &
                     0.0_c_double, 'r8 reduce_scatter max')
    send = [(val(world_rank, i), i=1, n)]
    call shardopt_allgather(comm, send, out, cnt, ierr)
    call check_close(out, gathered(size(out), cnt, 0.0_c_double), 0.0_c_double, 0.0_c_double, 'r8 allgather')
    buf = send
    call shardopt_broadcast(comm, buf, cnt, 0, ierr)
    call check_close(buf, [(val(0, i), i=1, n)], 0.0_c_double, 0.0_c_double, 'r8 broadcast from rank 0')
  end subroutine

  subroutine test_i4(comm)
    type(shardopt_comm), intent(in) :: comm
    integer, parameter :: n = 7, cnt = 6
    integer(c_int32_t) :: send(n), recv(n), buf(n)
    integer(c_int32_t), allocatable :: big(:), out(:)
    real(c_double) :: want(n)
    integer :: i, op
    do op = SHARDOPT_SUM, SHARDOPT_MIN
      if (op == SHARDOPT_AVG) cycle
      send = [(int(val(world_rank, i), c_int32_t), i=1, n)]
      recv = -99
      call shardopt_allreduce(comm, send, recv, cnt, op, ierr)
      want = reduced(op, n, cnt, 1, -99.0_c_double)
      call check_close(real(recv, c_double), want, 0.0_c_double, 0.0_c_double, 'i4 allreduce '//op_label(op))
    end do
    ! The average of integers is not defined: refused, with a message.
    call shardopt_allreduce(comm, send, recv, cnt, SHARDOPT_AVG, ierr)
    call check_fails(ierr, shardopt_error_message(), 'shardopt_allreduce', 'i4 allreduce avg is refused')
    allocate (big(cnt*world_size), out(cnt*world_size))
    big = [(int(val(world_rank, i), c_int32_t), i=1, cnt*world_size)]
    call shardopt_reduce_scatter(comm, big, cnt, SHARDOPT_MIN, ierr)
    call check_close(real(big(1:cnt), c_double), reduced(SHARDOPT_MIN, cnt, cnt, world_rank*cnt + 1, 0.0_c_double), &
                     0.0_c_double, 0.0_c_double, 'i4 reduce_scatter in place min')
    send = [(int(val(world_rank, i), c_int32_t), i=1, n)]
    out = 0
    out(world_rank*cnt + 1:(world_rank + 1)*cnt) = send(1:cnt)
    call shardopt_allgather(comm, out, cnt, ierr)
    call check_close(real(out, c_double), gathered(size(out), cnt, 0.0_c_double), 0.0_c_double, 0.0_c_double, &
                     'i4 allgather in place')
    buf = send
    call shardopt_broadcast(comm, buf, n, world_size/2, ierr)
    call check_close(real(buf, c_double), [(val(world_size/2, i), i=1, n)], 0.0_c_double, 0.0_c_double, &
                     'i4 broadcast from the middle rank')
  end subroutine

  subroutine test_i8(comm)
    type(shardopt_comm), intent(in) :: comm
    integer, parameter :: n = 5, cnt = 5
    ! Values past 2**32: the 64-bit type must be kept.
    integer(c_int64_t), parameter :: scale = 2_c_int64_t**33
    integer(c_int64_t) :: send(n), recv(n)
    integer(c_int64_t), allocatable :: big(:), out(:)
    integer :: i
    send = [(int(val(world_rank, i), c_int64_t)*scale + world_rank, i=1, n)]
    call shardopt_allreduce(comm, send, recv, cnt, SHARDOPT_SUM, ierr)
    call check(ierr == 0 .and. all(recv == [(expected_i8(i, scale), i=1, n)]), 'i8 allreduce sum keeps 64 bits')
    allocate (big(cnt*world_size), out(cnt*world_size))
    big = [(int(val(world_rank, i), c_int64_t)*scale, i=1, cnt*world_size)]
    call shardopt_reduce_scatter(comm, big, recv, cnt, SHARDOPT_SUM, ierr)
    call check_close(real(recv/scale, c_double), reduced(SHARDOPT_SUM, n, cnt, world_rank*cnt + 1, 0.0_c_double), &
                     0.0_c_double, 0.0_c_double, 'i8 reduce_scatter')
    call shardopt_allgather(comm, send, out, cnt, ierr)
    call check(ierr == 0 .and. all(out == [((int(val(i/cnt, modulo(i, cnt) + 1), c_int64_t)*scale + i/cnt), &
                                            i=0, cnt*world_size - 1)]), 'i8 allgather')
  end subroutine

  function expected_i8(i, scale) result(v)
    integer, intent(in) :: i
    integer(c_int64_t), intent(in) :: scale
    integer(c_int64_t) :: v
    integer :: r
    v = 0
    do r = 0, world_size - 1
      v = v + int(val(r, i), c_int64_t)*scale + r
    end do
  end function

  subroutine test_bad_arguments(comm)
    type(shardopt_comm), intent(in) :: comm
    type(shardopt_comm) :: gone, copy
    real(c_double) :: send(8), recv(8), small(3)
    real(c_double), allocatable :: big(:)
    integer :: nranks, i
    character(len=:), allocatable :: msg, hint
    nranks = world_size
    send = 1
    call shardopt_allreduce(comm, send, recv, -1, SHARDOPT_SUM, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'shardopt_allreduce: count = -1 is negative', 'negative count')
    call check(shardopt_error_status() == SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_error_status after a module error')
    msg = shardopt_error_message()
    hint = shardopt_error_hint()
    call check(index(msg, ' (hint: '//hint//')') > 0 .and. len(hint) > 0, 'the message carries the hint')
    call shardopt_allreduce(comm, send, small, 8, SHARDOPT_SUM, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'recv has 3 elements, fewer than count = 8', 'count larger than recv')
    call shardopt_broadcast(comm, small, 4, 0, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'shardopt_broadcast: buf has 3 elements, fewer than count = 4', 'count larger than buf')
    allocate (big(4*nranks - 1))
    big = 1
    call shardopt_reduce_scatter(comm, big, recv, 4, SHARDOPT_SUM, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'send has '//itoa(4*nranks - 1)//' elements, fewer than count * ranks', &
                      'reduce_scatter send smaller than count * ranks')
    call shardopt_allgather(comm, send, big, 4, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'shardopt_allgather: recv has '//itoa(4*nranks - 1)//' elements', &
                      'allgather recv smaller than count * ranks')
    call shardopt_allgather(comm, big, 4, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'buf has '//itoa(4*nranks - 1)//' elements', 'in-place allgather buf too small')
    ! A root that is not a rank: the C API's check, on every rank.
    call shardopt_broadcast(comm, send, 8, nranks, ierr)
    call check_fails(ierr, shardopt_error_message(), 'root', 'broadcast from root = size is refused')
    ! Still usable after the mistakes.
    send = world_rank + 1
    call shardopt_allreduce(comm, send, recv, 8, SHARDOPT_SUM, ierr)
    call check(ierr == 0, 'allreduce after the mistakes: '//shardopt_error_message())
    call check_close(recv, [(real(nranks*(nranks + 1)/2, c_double), i=1, 8)], 0.0_c_double, 0.0_c_double, &
                     'allreduce works after the mistakes')

    ! A handle used after destroy: the variable destroyed (null) and a copy.
    call shardopt_comm_create(MPI_COMM_WORLD, gone, ierr=ierr)
    copy = gone
    call shardopt_comm_destroy(gone, ierr)
    call check(ierr == 0, 'destroying a communicator')
    call shardopt_allreduce(comm=gone, send=send, recv=recv, count=8, op=SHARDOPT_SUM, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'NULL', 'allreduce on a destroyed communicator')
    call shardopt_allreduce(copy, send, recv, 8, SHARDOPT_SUM, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'was destroyed', &
                      'allreduce on a copy of a destroyed communicator')
    call shardopt_barrier(copy, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'shardopt_barrier', &
                      'barrier on a copy of a destroyed communicator')
    call shardopt_comm_destroy(gone, ierr)
    call check(ierr == 0, 'destroying a destroyed (null) communicator again is accepted')
    call shardopt_clear_error()
    msg = shardopt_error_message()
    call check(shardopt_error_status() == SHARDOPT_SUCCESS .and. len(msg) == 0, 'shardopt_clear_error forgets the error')
  end subroutine

  function itoa(i) result(s)
    integer, intent(in) :: i
    character(len=:), allocatable :: s
    character(len=16) :: b
    write (b, '(i0)') i
    s = trim(b)
  end function

  subroutine test_version()
    integer :: major, minor, patch, devices
    character(len=64) :: b
    call shardopt_device_count(devices, ierr)
    call check(ierr == 0 .and. devices >= 0, 'shardopt_device_count')
    call shardopt_version(major, minor, patch)
    write (b, '(i0,a,i0,a,i0)') major, '.', minor, '.', patch
    call check(shardopt_version_string() == trim(b), 'shardopt_version_string '//shardopt_version_string()// &
               ' matches shardopt_version '//trim(b))
    call check(shardopt_status_name(SHARDOPT_ERR_INVALID_STATE) == 'SHARDOPT_ERR_INVALID_STATE', &
               'shardopt_status_name')
  end subroutine

end program test_fortran_comm
