! shardopt: the Fortran module (docs/fortran.md).
!
! lib/fortran/ holds its source. The build (module_source.py) writes this
! file with its include lines replaced, and gfortran compiles that copy:
! - c_api.inc: the C API's named constants, bind(c) types and C function
!   interfaces, read from include/shardopt/status.h and shardopt.h by
!   c_api.py. A new C function needs nothing here, unless the tables of
!   c_api.py lack one of its types (the build stops, naming it).
! - c_wrappers.inc: the procedures that only call their C function
!   (shardopt_comm_rank, shardopt_step, ...), a row each of WRAPPERS in
!   c_wrappers.py, doc comment included.
! - kind_interfaces.inc, kind_wrappers.inc: the specifics of the generics
!   over array types and ranks (allreduce_r4, ..., params_add_h_2, ...),
!   templates in kind_wrappers.py; a new kind is a row of its KINDS.
! - errors.inc: strings and the module's errors, written by hand.
! A routine with logic of its own is written here, and made public below.
! Over 700 lines: a Fortran module is one source file (the include lines
! above are pieces of it); what is left here is the procedures with logic
! of their own, each short.

! module shardopt gives Fortran codes the ZeRO optimizer and the
! communicator of the C API (include/shardopt/shardopt.h) with Fortran
! arrays: the user never computes an address. Conventions:
!
! - Every procedure takes an optional `integer, intent(out) :: ierr`: the
!   status (SHARDOPT_SUCCESS = 0, else a SHARDOPT_ERR_* code), whose message
!   shardopt_error_message() returns. Without ierr a failure stops the
!   program (error stop) with the message and its hint, on the failing rank.
! - Parameters and parameter groups are numbered from 1, as Fortran arrays
!   are; ranks (and the broadcast root) from 0, as MPI numbers them. The
!   C API's messages do the same, and name this module's procedures,
!   keyword arguments and types: the module tells it its caller speaks
!   Fortran (shardopt_set_language) before its first call that can fail.
! - Collective procedures are called by every rank of the communicator, in
!   the same order, as in the C API.
module shardopt
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: output_unit
  use mpi_f08, only: MPI_Comm, MPI_COMM_WORLD, MPI_Initialized, MPI_Finalized, MPI_Comm_rank
  implicit none
  private

  ! The C API's constants, types and functions (c_api.py).
  include 'c_api.inc'

  ! The handles. ptr is the C API's handle (shardopt_comm_t,
  ! shardopt_optimizer_t), for codes that call the C functions too.
  type, public :: shardopt_comm
    type(c_ptr) :: ptr = c_null_ptr
  end type

  type, public :: shardopt_optimizer
    type(c_ptr) :: ptr = c_null_ptr
    integer, private :: num_groups = 0
    character(len=:), allocatable, private :: names(:)
  end type

  ! One registered array, kept until the optimizer is created.
  type :: param_entry
    character(len=:), allocatable :: name
    type(c_ptr) :: data = c_null_ptr
    type(c_ptr) :: grad = c_null_ptr
    integer(c_size_t) :: count = 0
    integer(c_int) :: dtype = SHARDOPT_F32
    integer :: group = 1
    integer :: unit = 0 ! stage 3's unit label (from 1; 0: a unit of its own)
    integer :: ndim = 1
    integer(c_size_t) :: shape(3) = 0 ! C order: the last Fortran extent first
  end type

  ! The parameter list that shardopt_optimizer_create registers.
  type, public :: shardopt_params
    private
    integer :: n = 0
    type(param_entry), allocatable :: e(:)
  end type

  public :: shardopt_version_string, shardopt_version
  public :: shardopt_error_message, shardopt_error_hint, shardopt_error_status, shardopt_status_name
  public :: shardopt_reports_error
  public :: shardopt_clear_error
  public :: shardopt_device_count, shardopt_set_device
  public :: shardopt_comm_create, shardopt_comm_destroy, shardopt_comm_rank, shardopt_comm_size
  public :: shardopt_comm_node
  public :: shardopt_comm_mpi
  public :: shardopt_allreduce, shardopt_reduce_scatter, shardopt_allgather, shardopt_broadcast
  public :: shardopt_barrier
  public :: shardopt_params_add, shardopt_params_count, shardopt_params_clear
  public :: shardopt_zero_options_init, shardopt_optimizer_create, shardopt_optimizer_destroy
  public :: shardopt_zero_grad, shardopt_grad_ready, shardopt_reduce_gradients
  public :: shardopt_clip_grad_norm, shardopt_step, shardopt_loss_scale, shardopt_steps
  public :: shardopt_num_params, shardopt_param_info, shardopt_param_grad
  public :: shardopt_num_units, shardopt_gather_unit, shardopt_igather_unit, shardopt_release_unit
  public :: shardopt_param_data
  public :: shardopt_set_lr, shardopt_set_hparams, shardopt_get_hparam
  public :: shardopt_memory_report, shardopt_gather_state, shardopt_check_sync
  public :: shardopt_save, shardopt_load, shardopt_load_metadata, shardopt_export
  public :: shardopt_functional_step, shardopt_functional_slots, shardopt_functional_slot_name

  interface shardopt_comm_create
    module procedure comm_create_f08, comm_create_int
  end interface

  interface shardopt_comm_mpi
    module procedure comm_mpi_f08, comm_mpi_int
  end interface

  interface shardopt_grad_ready
    module procedure grad_ready_buffer
  end interface

  interface shardopt_optimizer_create
    module procedure optimizer_create_groups, optimizer_create_one
  end interface

  ! shardopt_allreduce, _reduce_scatter, _allgather, _broadcast, _params_add,
  ! _param_grad, _param_data, _gather_state and the array forms of
  ! shardopt_grad_ready.
  include 'kind_interfaces.inc'

  interface
    function c_strlen(s) bind(c, name='strlen') result(n)
      import
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function
  end interface

  ! The last failure the module found itself (bad Fortran arguments, found
  ! before any C call). A later failing C call takes over: the message of
  ! the latest failure is the one shardopt_error_message() returns.
  logical :: own_error = .false.
  integer :: own_status = SHARDOPT_SUCCESS
  character(len=:), allocatable :: own_message, own_hint

  ! SHARDOPT_LANGUAGE_FORTRAN: the C API's messages name the module's
  ! procedures, keyword arguments and types, and number parameters and
  ! groups from 1. Said once per process, by the first procedure that can
  ! reach the C API with something to report (speak_fortran).
  logical :: language_said = .false.

  integer, parameter :: OP_ALLREDUCE = 1, OP_REDUCE_SCATTER = 2, OP_ALLGATHER = 3, OP_BROADCAST = 4
  character(len=*), parameter :: OP_NAMES(4) = [character(len=23) :: 'shardopt_allreduce', &
                                                 'shardopt_reduce_scatter', 'shardopt_allgather', 'shardopt_broadcast']

contains

  ! Strings, and the module's errors: the message accessors, done(), fail()
  ! (errors.inc).
  include 'errors.inc'

  ! ------------------------------------------------------------------
  ! Version and devices (local).

  !> The library's version at run time ("0.4.0").
  function shardopt_version_string() result(s)
    character(len=:), allocatable :: s
    s = from_c(c_version_string())
  end function

  ! ------------------------------------------------------------------
  ! The communicator.

  !> Collective over base: a shardopt communicator on a duplicate of it.
  !> Options: max_chunk_elements (largest count per MPI call), check_arguments
  !> (agree on every operation's arguments first), device_comm ("auto",
  !> "nccl", "staged", "mpi"), host_comm ("auto", "mpi", "shm", "hier").
  subroutine comm_create_f08(base, comm, max_chunk_elements, check_arguments, device_comm, ierr, host_comm)
    type(MPI_Comm), intent(in) :: base
    type(shardopt_comm), intent(out) :: comm
    integer(c_int64_t), intent(in), optional :: max_chunk_elements
    logical, intent(in), optional :: check_arguments
    character(len=*), intent(in), optional :: device_comm
    integer, intent(out), optional :: ierr
    character(len=*), intent(in), optional :: host_comm
    call comm_create_int(base%MPI_VAL, comm, max_chunk_elements, check_arguments, device_comm, ierr, host_comm)
  end subroutine

  !> The same from the integer handle of `use mpi` (or mpif.h).
  subroutine comm_create_int(base, comm, max_chunk_elements, check_arguments, device_comm, ierr, host_comm)
    integer, intent(in) :: base
    type(shardopt_comm), intent(out) :: comm
    integer(c_int64_t), intent(in), optional :: max_chunk_elements
    logical, intent(in), optional :: check_arguments
    character(len=*), intent(in), optional :: device_comm
    integer, intent(out), optional :: ierr
    character(len=*), intent(in), optional :: host_comm
    type(comm_options_t) :: options
    character(kind=c_char), allocatable, target :: dc(:), hc(:)
    type(c_ptr), allocatable :: dp(:), hp(:)
    integer :: status
    call speak_fortran()
    status = c_comm_options_init(options)
    if (present(max_chunk_elements)) then
      if (max_chunk_elements < 0) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_comm_create: max_chunk_elements = '// &
                  itoa(max_chunk_elements)//' is negative', &
                  'pass a positive element count, or 0 for the default', ierr)
        return
      end if
      options%max_chunk_elements = int(max_chunk_elements, c_size_t)
    end if
    if (present(check_arguments)) options%check_arguments = logical_int(check_arguments)
    if (present(device_comm)) then
      call c_strings([device_comm], dc, dp)
      options%device_comm = dp(1)
    end if
    if (present(host_comm)) then
      call c_strings([host_comm], hc, hp)
      options%host_comm = hp(1)
    end if
    call done(c_comm_create_f(int(base, c_int), options, comm%ptr), ierr)
  end subroutine

  !> The duplicated MPI communicator (owned by comm: do not free it).
  subroutine comm_mpi_f08(comm, dup, ierr)
    type(shardopt_comm), intent(in) :: comm
    type(MPI_Comm), intent(out) :: dup
    integer, intent(out), optional :: ierr
    integer(c_int) :: h
    h = 0
    call done(c_comm_mpi_f(comm%ptr, h), ierr)
    dup%MPI_VAL = int(h)
  end subroutine

  subroutine comm_mpi_int(comm, dup, ierr)
    type(shardopt_comm), intent(in) :: comm
    integer, intent(out) :: dup
    integer, intent(out), optional :: ierr
    type(MPI_Comm) :: d
    call comm_mpi_f08(comm, d, ierr)
    dup = d%MPI_VAL
  end subroutine

  ! ------------------------------------------------------------------
  ! Collectives. Each specific (kind_wrappers.py) passes its arrays'
  ! addresses and sizes to collective(), which checks count against them
  ! (the C API cannot see a Fortran array's size) and calls the C function.

  ! Checks that an array of `have` elements holds `need` (count, or count
  ! times the rank count when per_rank); false after reporting it.
  function fits(what, array, have, need, count, per_rank, nranks, ierr) result(ok)
    integer, intent(in) :: what
    character(len=*), intent(in) :: array
    integer(c_int64_t), intent(in) :: have, need
    integer, intent(in) :: count, nranks
    logical, intent(in) :: per_rank
    integer, intent(out), optional :: ierr
    logical :: ok
    character(len=:), allocatable :: needed
    ok = have >= need
    if (ok) return
    if (per_rank) then
      needed = 'count * ranks = '//str(count)//' * '//str(nranks)//' = '//itoa(need)
    else
      needed = 'count = '//str(count)
    end if
    call fail(SHARDOPT_ERR_INVALID_ARGUMENT, trim(OP_NAMES(what))//': '//array//' has '//itoa(have)// &
              ' elements, fewer than '//needed, &
              'pass a smaller count or a larger array ('//array//' needs '//itoa(need)//' elements)', ierr)
  end function

  ! in_place: send and recv are one array (buf). For allgather, this rank's
  ! block is read from its place in buf, as the C API's in-place form wants.
  subroutine collective(what, comm, send, nsend, recv, nrecv, in_place, elem_bytes, count, dtype, op, ierr)
    integer, intent(in) :: what
    type(shardopt_comm), intent(in) :: comm
    type(c_ptr), intent(in) :: send, recv
    integer, intent(in) :: nsend, nrecv
    logical, intent(in) :: in_place
    integer, intent(in) :: elem_bytes, count, dtype, op
    integer, intent(out), optional :: ierr
    integer(c_int) :: st, nranks, rank
    integer(c_int64_t) :: need_send, need_recv
    type(c_ptr) :: s
    character(len=:), allocatable :: send_name, recv_name
    if (count < 0) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, trim(OP_NAMES(what))//': count = '//str(count)//' is negative', &
                'pass the number of elements per rank (>= 0)', ierr)
      return
    end if
    nranks = 1
    if (what == OP_REDUCE_SCATTER .or. what == OP_ALLGATHER) then
      st = c_comm_size(comm%ptr, nranks)
      ! A bad handle: the C function reports it under its own name.
      if (st /= SHARDOPT_SUCCESS) nranks = 1
    end if
    need_send = count
    need_recv = count
    if (what == OP_REDUCE_SCATTER) need_send = int(count, c_int64_t)*nranks
    if (what == OP_ALLGATHER) need_recv = int(count, c_int64_t)*nranks
    send_name = 'send'
    recv_name = 'recv'
    if (in_place) then
      send_name = 'buf'
      recv_name = 'buf'
      need_send = max(need_send, need_recv)
      need_recv = need_send
    end if
    if (what == OP_BROADCAST) send_name = 'buf'
    if (.not. fits(what, send_name, int(nsend, c_int64_t), need_send, count, &
                   what == OP_REDUCE_SCATTER .or. (in_place .and. what == OP_ALLGATHER), int(nranks), &
                   ierr)) return
    if (what /= OP_BROADCAST .and. .not. in_place) then
      if (.not. fits(what, recv_name, int(nrecv, c_int64_t), need_recv, count, what == OP_ALLGATHER, &
                     int(nranks), ierr)) return
    end if
    select case (what)
    case (OP_ALLREDUCE)
      st = c_allreduce(comm%ptr, send, recv, int(count, c_size_t), int(dtype, c_int), int(op, c_int))
    case (OP_REDUCE_SCATTER)
      st = c_reduce_scatter(comm%ptr, send, recv, int(count, c_size_t), int(dtype, c_int), int(op, c_int))
    case (OP_ALLGATHER)
      s = send
      if (in_place .and. count > 0) then
        st = c_comm_rank(comm%ptr, rank)
        if (st == SHARDOPT_SUCCESS) s = advance(recv, int(rank, c_int64_t)*count*elem_bytes)
      end if
      st = c_allgather(comm%ptr, s, recv, int(count, c_size_t), int(dtype, c_int))
    case default
      st = c_broadcast(comm%ptr, send, int(count, c_size_t), int(dtype, c_int), int(op, c_int))
    end select
    call done(st, ierr)
  end subroutine

  ! p + bytes.
  function advance(p, bytes) result(q)
    type(c_ptr), intent(in) :: p
    integer(c_int64_t), intent(in) :: bytes
    type(c_ptr) :: q
    integer(c_intptr_t) :: a
    a = transfer(p, a)
    a = a + int(bytes, c_intptr_t)
    q = transfer(a, q)
  end function

  ! ------------------------------------------------------------------
  ! The parameter list.

  ! Appends one array. data and grad are the addresses the optimizer will
  ! use for its whole life: the arrays must be contiguous (no temporary
  ! copy may stand in for them).
  subroutine add_entry(params, name, data, data_contiguous, count, fshape, dtype, has_grad, grad, &
                       grad_contiguous, grad_count, group, ierr, unit)
    type(shardopt_params), intent(inout) :: params
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: data, grad
    logical, intent(in) :: data_contiguous, has_grad, grad_contiguous
    integer(c_size_t), intent(in) :: count, grad_count
    integer(c_size_t), intent(in) :: fshape(:)
    integer, intent(in) :: dtype
    integer, intent(in), optional :: group
    integer, intent(out), optional :: ierr
    integer, intent(in), optional :: unit
    type(param_entry), allocatable :: grown(:)
    type(param_entry) :: e
    integer :: k, nd
    character(len=:), allocatable :: who
    who = 'shardopt_params_add: parameter '''//trim(name)//''''
    if (len_trim(name) == 0) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_params_add: the name is empty', &
                'give every parameter a unique, non-empty name (checkpoints store it)', ierr)
      return
    end if
    if (.not. data_contiguous) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, who//': the array is not contiguous', &
                'pass a whole array (or a contiguous section of one) with the target attribute: the '// &
                'optimizer reads and writes it in place for its whole life', ierr)
      return
    end if
    if (has_grad) then
      if (.not. grad_contiguous) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, who//': its grad array is not contiguous', &
                  'pass a whole array with the target attribute as grad, or no grad (the optimizer '// &
                  'then keeps the gradient: shardopt_param_grad)', ierr)
        return
      end if
      if (grad_count /= count) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, who//' has '//itoa(int(count, c_int64_t))// &
                  ' elements but its grad array has '//itoa(int(grad_count, c_int64_t)), &
                  'pass a gradient array of the parameter''s size', ierr)
        return
      end if
    end if
    e%group = 1
    if (present(group)) e%group = group
    if (e%group < 1) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, who//': group = '//str(e%group)//' is not a group', &
                'groups are numbered from 1 (the first optimizer spec) in Fortran', ierr)
      return
    end if
    if (present(unit)) e%unit = unit
    if (e%unit < 0) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, who//': unit = '//str(e%unit)//' is negative', &
                'number the units from 1 (consecutive arrays with one number form a unit), or leave '// &
                'unit out: the array is then a unit of its own', ierr)
      return
    end if
    e%name = trim(name)
    e%data = data
    e%grad = c_null_ptr
    if (has_grad) e%grad = grad
    e%count = count
    e%dtype = int(dtype, c_int)
    nd = size(fshape)
    e%ndim = nd
    do k = 1, nd
      e%shape(k) = fshape(nd - k + 1)
    end do
    if (.not. allocated(params%e)) allocate (params%e(8))
    if (params%n == size(params%e)) then
      allocate (grown(2*size(params%e)))
      grown(1:params%n) = params%e(1:params%n)
      call move_alloc(grown, params%e)
    end if
    params%n = params%n + 1
    params%e(params%n) = e
    if (present(ierr)) ierr = SHARDOPT_SUCCESS
  end subroutine

  ! 16-bit parameters: integer(2) arrays holding the bits of bf16 or f16
  ! values, dtype SHARDOPT_BF16 or SHARDOPT_F16.
  function half_dtype_ok(name, dtype, ierr) result(ok)
    character(len=*), intent(in) :: name
    integer, intent(in) :: dtype
    integer, intent(out), optional :: ierr
    logical :: ok
    ok = dtype == SHARDOPT_BF16 .or. dtype == SHARDOPT_F16
    if (.not. ok) call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_params_add: parameter '''//trim(name)// &
                            ''' is an integer(2) array with dtype = '//str(dtype), &
                            'integer(2) arrays hold 16-bit values: pass dtype = SHARDOPT_BF16 or '// &
                            'SHARDOPT_F16 (real(4) arrays are SHARDOPT_F32)', ierr)
  end function

  subroutine refuse_real8(name, position, n, group, unit, ierr)
    character(len=*), intent(in) :: name
    integer, intent(in) :: position, n
    integer, intent(in), optional :: group, unit
    integer, intent(out), optional :: ierr
    character(len=:), allocatable :: where
    where = ' (number '//str(position)//' of the list'
    if (present(group)) where = where//', group '//str(group)
    if (present(unit)) where = where//', unit '//str(unit)
    call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_params_add: parameter '''//trim(name)// &
              ''''//where//') is a real(8) array ('//str(n)// &
              ' elements): the optimizer takes real(4) '// &
              'parameters (f32, or bf16/f16 as integer(2))', &
              'keep a real(4) copy of the parameters for the optimizer (it keeps fp32 master values '// &
              'and optimizer state); real(8) arrays go to the collectives', ierr)
  end subroutine

  !> The number of arrays in the list.
  function shardopt_params_count(params) result(n)
    type(shardopt_params), intent(in) :: params
    integer :: n
    n = params%n
  end function

  !> Empties the list (the optimizers made from it are not affected).
  subroutine shardopt_params_clear(params)
    type(shardopt_params), intent(inout) :: params
    params%n = 0
    if (allocated(params%e)) deallocate (params%e)
  end subroutine

  ! ------------------------------------------------------------------
  ! The optimizer.

  !> Collective over comm: registers the list's arrays (the same on every
  !> rank, in the same order) with one optimizer spec per parameter group
  !> (groups(1) is group 1: "adamw lr=1e-3 weight_decay=0.01"; one kind for
  !> all groups). Options: a whole options value, or the common ones by
  !> keyword (which take precedence): stage (0 to 3), bucket_mb,
  !> reduce_sum (sum rather than average gradients over ranks),
  !> check_sync_every, non_finite (SHARDOPT_NON_FINITE_*), loss_scaler.
  subroutine optimizer_create_groups(comm, params, groups, opt, options, stage, bucket_mb, reduce_sum, &
                                     check_sync_every, non_finite, loss_scaler, ierr)
    type(shardopt_comm), intent(in) :: comm
    type(shardopt_params), intent(in) :: params
    character(len=*), intent(in) :: groups(:)
    type(shardopt_optimizer), intent(out) :: opt
    type(shardopt_zero_options_t), intent(in), optional :: options
    integer, intent(in), optional :: stage
    real(c_double), intent(in), optional :: bucket_mb
    logical, intent(in), optional :: reduce_sum
    integer, intent(in), optional :: check_sync_every, non_finite
    logical, intent(in), optional :: loss_scaler
    integer, intent(out), optional :: ierr
    type(shardopt_zero_options_t) :: o
    type(shardopt_param_t), allocatable, target :: cp(:)
    character(kind=c_char), allocatable, target :: names(:), specs(:)
    type(c_ptr), allocatable, target :: spec_ptrs(:)
    type(c_ptr), allocatable :: name_ptrs(:)
    integer(c_size_t), allocatable, target :: shapes(:, :)
    type(c_ptr) :: params_ptr, groups_ptr
    integer :: i, ng, namelen
    integer(c_int) :: st
    call speak_fortran()
    ng = size(groups)
    if (ng < 1) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_optimizer_create: no optimizer spec given', &
                'pass at least one spec, e.g. ''adamw lr=1e-3''', ierr)
      return
    end if
    do i = 1, params%n
      if (params%e(i)%group > ng) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_optimizer_create: parameter '''// &
                  params%e(i)%name//''' is in group '//str(params%e(i)%group)//', but '//str(ng)// &
                  ' optimizer spec(s) were given', &
                  'pass one spec per group (groups are numbered from 1), or add the parameter to '// &
                  'an existing group', ierr)
        return
      end if
    end do
    st = c_zero_options_init(o)
    if (present(options)) o = options
    if (present(stage)) o%stage = int(stage, c_int)
    if (present(bucket_mb)) o%bucket_mb = bucket_mb
    if (present(reduce_sum)) o%reduce_sum = logical_int(reduce_sum)
    if (present(check_sync_every)) o%check_sync_every = int(check_sync_every, c_int)
    if (present(non_finite)) o%non_finite = int(non_finite, c_int)
    if (present(loss_scaler)) o%loss_scaler = logical_int(loss_scaler)

    ! The names and specs as NUL-terminated strings, alive until the C call
    ! returns (the optimizer copies them).
    namelen = 1
    do i = 1, params%n
      namelen = max(namelen, len(params%e(i)%name))
    end do
    allocate (character(len=namelen) :: opt%names(params%n))
    allocate (cp(max(params%n, 1)), shapes(3, max(params%n, 1)))
    do i = 1, params%n
      opt%names(i) = params%e(i)%name
    end do
    call c_strings(opt%names, names, name_ptrs)
    call c_strings(groups, specs, spec_ptrs)
    do i = 1, params%n
      cp(i)%name = name_ptrs(i)
      cp(i)%data = params%e(i)%data
      cp(i)%count = params%e(i)%count
      cp(i)%dtype = params%e(i)%dtype
      cp(i)%grad = params%e(i)%grad
      cp(i)%group = int(params%e(i)%group - 1, c_int)
      shapes(:, i) = params%e(i)%shape
      cp(i)%shape = c_loc(shapes(1, i))
      cp(i)%ndim = int(params%e(i)%ndim, c_int)
      cp(i)%unit = int(params%e(i)%unit, c_int)
    end do
    params_ptr = c_null_ptr
    if (params%n > 0) params_ptr = c_loc(cp)
    groups_ptr = c_loc(spec_ptrs)
    st = c_optimizer_create(comm%ptr, params_ptr, int(params%n, c_size_t), groups_ptr, int(ng, c_int), o, opt%ptr)
    if (st == SHARDOPT_SUCCESS) then
      opt%num_groups = ng
    else
      deallocate (opt%names)
    end if
    call done(st, ierr)
  end subroutine

  !> As above with one parameter group.
  subroutine optimizer_create_one(comm, params, spec, opt, options, stage, bucket_mb, reduce_sum, &
                                  check_sync_every, non_finite, loss_scaler, ierr)
    type(shardopt_comm), intent(in) :: comm
    type(shardopt_params), intent(in) :: params
    character(len=*), intent(in) :: spec
    type(shardopt_optimizer), intent(out) :: opt
    type(shardopt_zero_options_t), intent(in), optional :: options
    integer, intent(in), optional :: stage
    real(c_double), intent(in), optional :: bucket_mb
    logical, intent(in), optional :: reduce_sum
    integer, intent(in), optional :: check_sync_every, non_finite
    logical, intent(in), optional :: loss_scaler
    integer, intent(out), optional :: ierr
    call optimizer_create_groups(comm, params, [spec], opt, options, stage, bucket_mb, reduce_sum, &
                                 check_sync_every, non_finite, loss_scaler, ierr)
  end subroutine

  ! Parameter i (from 1) as the C API's 0-based index; false after
  ! reporting an index out of range. When opt itself is bad, true: the C
  ! function called next reports that under its own name.
  function param_index(opt, i, where, ierr) result(ok)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    character(len=*), intent(in) :: where
    integer, intent(out), optional :: ierr
    logical :: ok
    integer(c_size_t) :: n
    ok = .true.
    if (c_num_params(opt%ptr, n) /= SHARDOPT_SUCCESS) return
    if (i >= 1 .and. i <= n) return
    ok = .false.
    call fail(SHARDOPT_ERR_INVALID_ARGUMENT, where//': parameter '//str(i)//' does not exist: the optimizer has '// &
              itoa(int(n, c_int64_t))//' parameters', &
              'parameters are numbered from 1 to '//itoa(int(n, c_int64_t))// &
              ' in Fortran, in the order they were added', ierr)
  end function

  function param_label(opt, i) result(s)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    character(len=:), allocatable :: s
    s = 'parameter '//str(i)
    if (allocated(opt%names)) then
      if (i >= 1 .and. i <= size(opt%names)) s = s//' ('''//trim(opt%names(i))//''')'
    end if
  end function

  ! Group g (from 1) as the C API's index (-1: every group, when g is absent
  ! and all_allowed); false after reporting a group out of range.
  function group_index(opt, group, all_allowed, where, g, ierr) result(ok)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in), optional :: group
    logical, intent(in) :: all_allowed
    character(len=*), intent(in) :: where
    integer(c_int), intent(out) :: g
    integer, intent(out), optional :: ierr
    logical :: ok
    character(len=:), allocatable :: hint
    ok = .true.
    if (.not. present(group)) then
      g = 0
      if (all_allowed) g = -1
      return
    end if
    g = int(group - 1, c_int)
    ! A destroyed or never created optimizer: the C function reports it.
    if (.not. c_associated(opt%ptr) .or. opt%num_groups == 0) return
    if (group >= 1 .and. group <= opt%num_groups) return
    ok = .false.
    hint = 'groups are numbered from 1 to '//str(opt%num_groups)//' in Fortran'
    if (all_allowed) hint = hint//', or leave group out for every group'
    call fail(SHARDOPT_ERR_INVALID_ARGUMENT, where//': group '//str(group)//' does not exist: the optimizer has '// &
              str(opt%num_groups)//' parameter group(s)', hint, ierr)
  end function

  !> Local: parameter i's gradient (from 1) is complete, in its registered
  !> or owned gradient buffer.
  subroutine grad_ready_buffer(opt, i, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    integer, intent(out), optional :: ierr
    if (.not. param_index(opt, i, 'shardopt_grad_ready', ierr)) return
    call done(c_grad_ready(opt%ptr, int(i - 1, c_size_t), c_null_ptr), ierr)
  end subroutine

  ! The gradient of parameter i in an array of `n` elements of dtype: copied
  ! by the C call after its size and type are checked against the parameter.
  subroutine grad_ready_array(opt, i, grad, n, dtype, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    type(c_ptr), intent(in) :: grad
    integer(c_size_t), intent(in) :: n
    integer, intent(in) :: dtype
    integer, intent(out), optional :: ierr
    integer(c_size_t) :: count
    integer(c_int) :: pdtype
    if (.not. param_index(opt, i, 'shardopt_grad_ready', ierr)) return
    if (c_param_info(opt%ptr, int(i - 1, c_size_t), count, pdtype) == SHARDOPT_SUCCESS) then
      if (pdtype /= dtype) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_grad_ready: '//param_label(opt, i)//' is '// &
                  type_name(int(pdtype))//' but the gradient passed is '//type_name(dtype), &
                  'pass the gradient as '//type_name(int(pdtype))//', the type of the parameter', ierr)
        return
      end if
      if (count /= n) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_grad_ready: '//param_label(opt, i)//' has '// &
                  itoa(int(count, c_int64_t))//' elements but the gradient passed has '//itoa(int(n, c_int64_t)), &
                  'pass a gradient array of the parameter''s size, or no array to use its registered '// &
                  'or owned gradient buffer', ierr)
        return
      end if
    end if
    call done(c_grad_ready(opt%ptr, int(i - 1, c_size_t), grad), ierr)
  end subroutine

  function type_name(dtype) result(s)
    integer, intent(in) :: dtype
    character(len=:), allocatable :: s
    character(len=*), parameter :: names(0:5) = [character(len=20) :: 'real(4) (f32)', 'real(8) (f64)', &
                                                  'integer(2) bf16 bits', 'integer(2) f16 bits', 'integer(4)', 'integer(8)']
    s = trim(names(max(0, min(dtype, 5))))
  end function

  ! An integer(2) gradient: the parameter's own 16-bit dtype, whichever it is.
  function half_of(opt, i) result(dtype)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    integer :: dtype
    integer(c_size_t) :: count
    integer(c_int) :: pdtype
    dtype = SHARDOPT_BF16
    if (i < 1) return
    if (c_param_info(opt%ptr, int(i - 1, c_size_t), count, pdtype) /= SHARDOPT_SUCCESS) return
    if (pdtype == SHARDOPT_F16) dtype = SHARDOPT_F16
  end function

  !> Local: parameter i's (from 1) element count and dtype (SHARDOPT_F32, ...).
  subroutine shardopt_param_info(opt, i, count, dtype, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    integer(c_int64_t), intent(out), optional :: count
    integer, intent(out), optional :: dtype
    integer, intent(out), optional :: ierr
    integer(c_size_t) :: c
    integer(c_int) :: d
    c = 0
    d = 0
    if (present(count)) count = 0
    if (present(dtype)) dtype = 0
    if (.not. param_index(opt, i, 'shardopt_param_info', ierr)) return
    call done(c_param_info(opt%ptr, int(i - 1, c_size_t), c, d), ierr)
    if (present(count)) count = int(c, c_int64_t)
    if (present(dtype)) dtype = int(d)
  end subroutine

  ! Parameter i's gradient buffer (which: 'grad') or whole values ('data')
  ! with its element count and dtype; false after reporting a failure.
  function param_buffer(opt, i, want, which, p, count, ierr) result(ok)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i, want
    character(len=*), intent(in) :: which
    type(c_ptr), intent(out) :: p
    integer(c_size_t), intent(out) :: count
    integer, intent(out), optional :: ierr
    logical :: ok
    integer(c_int) :: st, dtype
    character(len=:), allocatable :: where
    ok = .false.
    p = c_null_ptr
    count = 0
    where = 'shardopt_param_'//which
    if (.not. param_index(opt, i, where, ierr)) return
    if (which == 'grad') then
      st = c_param_grad(opt%ptr, int(i - 1, c_size_t), p)
    else
      st = c_param_data(opt%ptr, int(i - 1, c_size_t), p)
    end if
    if (st == SHARDOPT_SUCCESS) st = c_param_info(opt%ptr, int(i - 1, c_size_t), count, dtype)
    if (st /= SHARDOPT_SUCCESS) then
      call done(st, ierr)
      return
    end if
    if ((want == SHARDOPT_F32) .neqv. (dtype == SHARDOPT_F32)) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, where//': '//param_label(opt, i)//' is '// &
                type_name(int(dtype))//', not '//type_name(want), &
                'pass a pointer of the parameter''s type: real(4) for f32, integer(2) for bf16/f16', ierr)
      return
    end if
    ok = .true.
    if (present(ierr)) ierr = SHARDOPT_SUCCESS
  end function

  ! Gathers state `name` of parameter i into `out` (n elements). On a size
  ! mismatch every rank still takes part in the gather (into a scratch
  ! array), so that one rank's mistake does not leave the others waiting.
  subroutine gather_state_into(opt, name, i, out, n, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    character(len=*), intent(in) :: name
    integer, intent(in) :: i
    type(c_ptr), intent(in) :: out
    integer(c_size_t), intent(in) :: n
    integer, intent(out), optional :: ierr
    integer(c_size_t) :: count
    integer(c_int) :: dtype, st
    real(c_float), allocatable, target :: scratch(:)
    if (.not. param_index(opt, i, 'shardopt_gather_state', ierr)) return
    count = n
    if (c_param_info(opt%ptr, int(i - 1, c_size_t), count, dtype) /= SHARDOPT_SUCCESS) count = n
    if (count == n) then
      call done(c_gather_state(opt%ptr, trim(name)//c_null_char, int(i - 1, c_size_t), out, n), ierr)
      return
    end if
    allocate (scratch(max(count, 1_c_size_t)))
    st = c_gather_state(opt%ptr, trim(name)//c_null_char, int(i - 1, c_size_t), c_loc(scratch), count)
    if (st /= SHARDOPT_SUCCESS) then
      call done(st, ierr)
      return
    end if
    call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_gather_state: '//param_label(opt, i)//' has '// &
              itoa(int(count, c_int64_t))//' elements but out has '//itoa(int(n, c_int64_t)), &
              'pass a real(4) array of the parameter''s size', ierr)
  end subroutine

  !> Collective: whether every rank's parameters hold the same bytes;
  !> message (if given) describes the first difference ('' when in sync).
  subroutine shardopt_check_sync(opt, in_sync, message, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    logical, intent(out) :: in_sync
    character(len=:), allocatable, intent(out), optional :: message
    integer, intent(out), optional :: ierr
    integer(c_int) :: s
    character(kind=c_char), target :: buf(4096)
    buf = c_null_char
    s = 1
    call done(c_check_sync(opt%ptr, s, c_loc(buf), size(buf, kind=c_size_t)), ierr)
    in_sync = s /= 0
    if (present(message)) message = from_buffer(buf)
  end subroutine

  !> Collective: writes a checkpoint to path (docs/checkpoint.md): keep_last
  !> files (default 1: replace), and metadata_keys(k) = metadata_values(k)
  !> pairs of the application's (read back by shardopt_load_metadata).
  subroutine shardopt_save(opt, path, keep_last, metadata_keys, metadata_values, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    character(len=*), intent(in) :: path
    integer, intent(in), optional :: keep_last
    character(len=*), intent(in), optional :: metadata_keys(:), metadata_values(:)
    integer, intent(out), optional :: ierr
    character(kind=c_char), allocatable, target :: kbuf(:), vbuf(:)
    type(c_ptr), allocatable, target :: kptr(:), vptr(:)
    integer :: keep, n
    keep = 1
    if (present(keep_last)) keep = keep_last
    if (present(metadata_keys) .neqv. present(metadata_values)) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_save: metadata_keys and metadata_values go together', &
                'pass both (one value per key) or neither', ierr)
      return
    end if
    n = 0
    if (present(metadata_keys)) then
      if (size(metadata_keys) /= size(metadata_values)) then
        call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_save: '//str(size(metadata_keys))// &
                  ' metadata_keys but '//str(size(metadata_values))//' metadata_values', &
                  'pass one value per key', ierr)
        return
      end if
      n = size(metadata_keys)
      call c_strings(metadata_keys, kbuf, kptr)
      call c_strings(metadata_values, vbuf, vptr)
    else
      allocate (kptr(1), vptr(1))
      kptr = c_null_ptr
      vptr = c_null_ptr
    end if
    call done(c_save(opt%ptr, trim(path)//c_null_char, int(keep, c_int), c_loc(kptr), c_loc(vptr), &
                     int(n, c_size_t)), ierr)
  end subroutine

  !> Local: the value of metadata key `key` of the last checkpoint loaded.
  subroutine shardopt_load_metadata(opt, key, value, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    character(len=*), intent(in) :: key
    character(len=:), allocatable, intent(out) :: value
    integer, intent(out), optional :: ierr
    character(kind=c_char), allocatable, target :: buf(:)
    integer(c_int) :: st
    integer :: size_bytes
    ! Values are short; a longer one is read again into a buffer large
    ! enough for any metadata value a checkpoint header holds.
    size_bytes = 4096
    do
      allocate (buf(size_bytes))
      buf = c_null_char
      st = c_load_metadata(opt%ptr, trim(key)//c_null_char, c_loc(buf), int(size_bytes, c_size_t))
      if (st == SHARDOPT_SUCCESS .or. size_bytes >= 16*1024*1024) exit
      if (index(from_c(c_last_error()), 'too small') == 0) exit
      deallocate (buf)
      size_bytes = 16*1024*1024
    end do
    value = from_buffer(buf)
    call done(st, ierr)
  end subroutine

  ! ------------------------------------------------------------------
  ! Functional optimizers (local): one step over the caller's arrays.

  !> The number of state arrays shardopt_functional_step takes for spec
  !> (adam: 3, exp_avg, exp_avg_sq, max_exp_avg_sq; lamb: its scratch too).
  subroutine shardopt_functional_slots(spec, num_states, ierr)
    character(len=*), intent(in) :: spec
    integer, intent(out) :: num_states
    integer, intent(out), optional :: ierr
    integer(c_int) :: n
    call speak_fortran()
    n = 0
    call done(c_functional_slots(trim(spec)//c_null_char, n, 0_c_int, c_null_ptr, 0_c_size_t), ierr)
    num_states = int(n)
  end subroutine

  !> The name of state slot k (from 1) of spec.
  subroutine shardopt_functional_slot_name(spec, k, name, ierr)
    character(len=*), intent(in) :: spec
    integer, intent(in) :: k
    character(len=:), allocatable, intent(out) :: name
    integer, intent(out), optional :: ierr
    character(kind=c_char), allocatable, target :: buf(:)
    integer(c_int) :: n
    call speak_fortran()
    allocate (buf(256))
    buf = c_null_char
    n = 0
    call done(c_functional_slots(trim(spec)//c_null_char, n, int(k - 1, c_int), c_loc(buf), &
                                 size(buf, kind=c_size_t)), ierr)
    name = from_buffer(buf)
  end subroutine

  ! Which of spec's nslots state slots its options use (shardopt_functional_slot_used);
  ! for a bad spec every slot counts as used and the step reports the problem.
  subroutine slots_in_use(spec, nslots, used)
    character(len=*), intent(in) :: spec
    integer, intent(in) :: nslots
    logical, intent(inout) :: used(:)
    integer :: k
    integer(c_int) :: u
    used(1:nslots) = .true.
    do k = 1, nslots
      if (c_functional_slot_used(spec//c_null_char, int(k - 1, c_int), u) == SHARDOPT_SUCCESS) &
        used(k) = u /= 0
    end do
  end subroutine

  !> One step of the optimizer of spec ("adam lr=1e-3") on params (real(4)),
  !> with grads (real(4), the size of params) and states(:, k), one column
  !> of the size of params per slot (shardopt_functional_slots), zero before
  !> the first step; the columns of slots the options do not use (adam's
  !> max_exp_avg_sq without amsgrad, ...) are left alone. step counts steps including this one. grad_mul
  !> multiplies the gradients first; skip_nonfinite skips the step when a
  !> gradient is inf or nan (applied then reports .false.).
  subroutine shardopt_functional_step(spec, params, grads, states, step, applied, grads_finite, grad_mul, &
                                      skip_nonfinite, ierr)
    character(len=*), intent(in) :: spec
    real(c_float), intent(inout), target, contiguous :: params(:)
    real(c_float), intent(in), target, contiguous :: grads(:)
    real(c_float), intent(inout), target, contiguous :: states(:, :)
    integer, intent(in) :: step
    logical, intent(out), optional :: applied, grads_finite
    real(c_double), intent(in), optional :: grad_mul
    logical, intent(in), optional :: skip_nonfinite
    integer, intent(out), optional :: ierr
    type(step_options_t) :: o
    type(c_ptr), allocatable, target :: ptrs(:)
    logical, allocatable :: used(:)
    integer(c_int) :: st, a, f, nslots
    integer :: k, n
    call speak_fortran()
    n = size(params)
    if (size(grads) /= n) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_functional_step: grads has '//str(size(grads))// &
                ' elements but params has '//str(n), 'pass one gradient per parameter', ierr)
      return
    end if
    if (size(states, 2) > 0 .and. size(states, 1) /= n) then
      call fail(SHARDOPT_ERR_INVALID_ARGUMENT, 'shardopt_functional_step: states has '// &
                str(size(states, 1))//' rows but params has '//str(n)//' elements', &
                'pass states(n, num_states): one column of the parameters'' size per slot', ierr)
      return
    end if
    allocate (ptrs(max(size(states, 2), 1)), used(max(size(states, 2), 1)))
    ptrs = c_null_ptr
    used = .true.
    if (c_functional_slots(trim(spec)//c_null_char, nslots, 0_c_int, c_null_ptr, 0_c_size_t) == SHARDOPT_SUCCESS) then
      if (nslots == size(states, 2)) call slots_in_use(trim(spec), int(nslots), used)
    end if
    do k = 1, size(states, 2)
      if (n > 0 .and. used(k)) ptrs(k) = c_loc(states(1, k))
    end do
    st = c_step_options_init(o)
    if (present(grad_mul)) o%grad_mul = grad_mul
    if (present(skip_nonfinite)) o%skip_nonfinite = logical_int(skip_nonfinite)
    a = 0
    f = 0
    st = c_functional_step(trim(spec)//c_null_char, addr_r4(params), int(SHARDOPT_F32, c_int), addr_r4(grads), &
                           int(SHARDOPT_F32, c_int), int(n, c_size_t), c_loc(ptrs), int(size(states, 2), c_int), &
                           int(step, c_int64_t), o, a, f)
    if (present(applied)) applied = a /= 0
    if (present(grads_finite)) grads_finite = f /= 0
    call done(st, ierr)
  end subroutine

  ! ------------------------------------------------------------------
  ! The procedures that only call their C function (c_wrappers.py).
  include 'c_wrappers.inc'

  ! ------------------------------------------------------------------
  ! The specifics of kind_interfaces.inc, and addr_r4, addr_r8, addr_i4 and
  ! addr_i8: a rank-1 array's address, NULL when it is empty.
  include 'kind_wrappers.inc'

end module shardopt
