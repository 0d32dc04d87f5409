! The ZeRO optimizer through the Fortran module, at any rank count, against
! a plain real(8) Fortran implementation of torch's SGD with momentum and
! AdamW on the same gradients (every rank's gradients differ; the
! reference averages them): two parameter groups, arrays of rank 1, 2 and
! 3 and an empty one, gradients given as arrays, in registered buffers and
! in the optimizer's own buffers, a learning-rate and weight-decay change
! and gradient clipping mid-run. Stages 0, 1 and 2 give bitwise the same
! parameters; a checkpoint saved mid-run, loaded and replayed gives them
! again bitwise. Stage 3 (units gathered, used, released) gives bitwise
! stage 2's parameters with the same units. Then bad input, each reported through ierr with its status
! and message, the optimizer still usable after a correctable mistake;
! 16-bit (bf16) parameters; and the functional step.
program test_fortran_zero
  use, intrinsic :: iso_c_binding
  use, intrinsic :: ieee_arithmetic, only: ieee_value, ieee_quiet_nan
  use mpi_f08
  use shardopt
  use ftest
  implicit none

  integer, parameter :: NSTEPS = 4, NPARAMS = 4, NTOTAL = 96
  integer, parameter :: sizes(NPARAMS) = [37, 35, 24, 0]
  integer, parameter :: group_of(NPARAMS) = [1, 2, 1, 2]
  ! The reference's tolerance: real(4) arithmetic against real(8) over a
  ! few steps, on values of order 1.
  real(c_double), parameter :: RTOL = 2e-5_c_double, ATOL = 2e-5_c_double
  integer, parameter :: SGD = 1, ADAMW = 2

  real(c_float), target :: w1(37), w2(5, 7), w3(3, 4, 2), wz(0), g2(5, 7)
  ! The reference: parameters, momentum buffer / first moment, second
  ! moment; learning rate and weight decay per group.
  real(c_double) :: rp(NTOTAL), rm(NTOTAL), rv(NTOTAL), lr(2), wd(2)
  type(shardopt_comm) :: comm
  real(c_float) :: final0(NTOTAL)
  character(len=64) :: ckpt, export_path
  integer :: stage

  call test_init()
  ! Without ierr: a failure here stops the test with the message.
  call shardopt_comm_create(MPI_COMM_WORLD, comm)
  write (ckpt, '(a,i0,a)') 'fortran-zero-np', world_size, '.ckpt'
  write (export_path, '(a,i0,a)') 'fortran-zero-np', world_size, '.safetensors'

  call run(SGD, 1, .false.)
  do stage = 0, 2
    call run(ADAMW, stage, stage == 1)
  end do
  call test_microbatches()
  call test_stage3()
  call test_options()
  call test_bad_input()
  call test_half()
  call test_functional()
  call test_non_finite()

  call shardopt_comm_destroy(comm)
  call shardopt_barrier_world()
  if (world_rank == 0) then
    call remove(ckpt)
    call remove(export_path)
  end if
  call test_finish('test_fortran_zero')

contains

  subroutine shardopt_barrier_world()
    call MPI_Barrier(MPI_COMM_WORLD)
  end subroutine

  subroutine remove(path)
    character(len=*), intent(in) :: path
    integer :: u, ios
    open (newunit=u, file=trim(path), status='old', iostat=ios)
    if (ios == 0) close (u, status='delete')
  end subroutine

  function label(kind, stage) result(s)
    integer, intent(in) :: kind, stage
    character(len=:), allocatable :: s
    character(len=32) :: b
    write (b, '(a,a,i0)') trim(merge('sgd  ', 'adamw', kind == SGD)), ' stage ', stage
    s = trim(b)
  end function

  ! The parameters, flattened in registration and array element order.
  function flat() result(v)
    real(c_float) :: v(NTOTAL)
    v = [w1, w2, w3, wz]
  end function

  subroutine set_params(v)
    real(c_double), intent(in) :: v(NTOTAL)
    w1 = real(v(1:37), c_float)
    w2 = reshape(real(v(38:72), c_float), [5, 7])
    w3 = reshape(real(v(73:96), c_float), [3, 4, 2])
  end subroutine

  ! Where every run starts: the parameters (the reference's and the
  ! registered arrays'), no moments, and each group's learning rate and
  ! weight decay.
  subroutine reset_reference()
    integer :: i
    rp = [(uval(999, 0, 1, i), i=1, NTOTAL)]
    rm = 0
    rv = 0
    lr = [0.05_c_double, 0.02_c_double]
    wd = [0.01_c_double, 0.0_c_double]
    call set_params(rp)
  end subroutine

  integer function offset(k)
    integer, intent(in) :: k
    offset = sum(sizes(1:k - 1))
  end function

  ! Rank r's gradient of parameter k at step s, element i.
  function grad_of(r, s, k) result(g)
    integer, intent(in) :: r, s, k
    real(c_float) :: g(sizes(k))
    integer :: i
    g = [(real(uval(r, s, k, i), c_float), i=1, sizes(k))]
  end function

  ! The gradients averaged over the ranks, in real(8).
  function average(s) result(a)
    integer, intent(in) :: s
    real(c_double) :: a(NTOTAL)
    integer :: k, r, i
    a = 0
    do k = 1, NPARAMS
      do r = 0, world_size - 1
        do i = 1, sizes(k)
          a(offset(k) + i) = a(offset(k) + i) + uval(r, s, k, i)
        end do
      end do
    end do
    a = a/world_size
  end function

  ! Hands this rank's gradients of step s to the optimizer, each parameter
  ! another way: an array (1), its registered buffer (2), the optimizer's
  ! own buffer (3), nothing to give (4, empty).
  subroutine feed(opt, s)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: s
    real(c_float), pointer :: owned(:)
    integer :: ierr
    call shardopt_grad_ready(opt, 1, grad_of(world_rank, s, 1), ierr)
    call check(ierr == 0, 'grad_ready with an array: '//shardopt_error_message())
    g2 = reshape(grad_of(world_rank, s, 2), [5, 7])
    call shardopt_grad_ready(opt, 2, ierr=ierr)
    call check(ierr == 0, 'grad_ready of a registered buffer: '//shardopt_error_message())
    call shardopt_param_grad(opt, 3, owned, ierr)
    call check(ierr == 0 .and. associated(owned), 'param_grad gives the owned buffer: '//shardopt_error_message())
    if (associated(owned)) then
      call check(size(owned) == 24, 'the owned buffer has the parameter''s size')
      owned = grad_of(world_rank, s, 3)
    end if
    call shardopt_grad_ready(opt, 3, ierr=ierr)
    call shardopt_grad_ready(opt, 4, ierr=ierr)
    call check(ierr == 0, 'grad_ready of an empty parameter: '//shardopt_error_message())
  end subroutine

  ! One step of torch's SGD (momentum 0.9, no dampening) or AdamW (betas
  ! 0.9, 0.999, eps 1e-8) on the reference, with the averaged gradients.
  subroutine reference_step(kind, s, g)
    integer, intent(in) :: kind, s
    real(c_double), intent(in) :: g(NTOTAL)
    integer :: k, e, grp
    real(c_double) :: d, bc1, bc2
    do k = 1, NPARAMS
      grp = group_of(k)
      do e = offset(k) + 1, offset(k) + sizes(k)
        if (kind == SGD) then
          d = g(e) + wd(grp)*rp(e)
          if (s == 1) then
            rm(e) = d
          else
            rm(e) = 0.9_c_double*rm(e) + d
          end if
          rp(e) = rp(e) - lr(grp)*rm(e)
        else
          rp(e) = rp(e)*(1 - lr(grp)*wd(grp))
          rm(e) = 0.9_c_double*rm(e) + 0.1_c_double*g(e)
          rv(e) = 0.999_c_double*rv(e) + 0.001_c_double*g(e)**2
          bc1 = 1 - 0.9_c_double**s
          bc2 = 1 - 0.999_c_double**s
          rp(e) = rp(e) - lr(grp)/bc1*rm(e)/(sqrt(rv(e))/sqrt(bc2) + 1e-8_c_double)
        end if
      end do
    end do
  end subroutine

  subroutine new_params(params, ierr)
    type(shardopt_params), intent(out) :: params
    integer, intent(out) :: ierr
    integer :: e1, e2, e3, e4
    call shardopt_params_add(params, 'w1', w1, group=1, ierr=e1)
    call shardopt_params_add(params, 'w2', w2, grad=g2, group=2, ierr=e2)
    call shardopt_params_add(params, 'w3', w3, group=1, ierr=e3)
    call shardopt_params_add(params, 'empty', wz, group=2, ierr=e4)
    ierr = max(e1, e2, e3, e4)
  end subroutine

  function specs(kind) result(s)
    integer, intent(in) :: kind
    character(len=80) :: s(2)
    if (kind == SGD) then
      s = [character(len=80) :: 'sgd lr=0.05 momentum=0.9 weight_decay=0.01', &
           'sgd lr=0.02 momentum=0.9 weight_decay=0']
    else
      s = [character(len=80) :: 'adamw lr=0.05 betas=0.9,0.999 eps=1e-8 weight_decay=0.01', &
           'adamw lr=0.02 betas=0.9,0.999 eps=1e-8 weight_decay=0']
    end if
  end function

  ! Steps first..last: the schedule's changes before step 3, clipping at
  ! step 3, the reference followed when `follow`.
  subroutine steps(opt, kind, first, last, follow, what)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: kind, first, last
    logical, intent(in) :: follow
    character(len=*), intent(in) :: what
    type(shardopt_step_info_t) :: info
    real(c_double) :: g(NTOTAL), norm, ref_norm, value, coef
    integer :: s, ierr
    character(len=8) :: at
    do s = first, last
      write (at, '(a,i0)') ' step ', s
      call shardopt_zero_grad(opt, ierr)
      call check(ierr == 0, what//at//': zero_grad: '//shardopt_error_message())
      if (s == 3) then
        call shardopt_set_lr(opt, 0.03_c_double, group=2, ierr=ierr)
        call check(ierr == 0, what//': set_lr of group 2: '//shardopt_error_message())
        call shardopt_set_hparams(opt, 'weight_decay=0.02', group=1, ierr=ierr)
        call check(ierr == 0, what//': set_hparams of group 1: '//shardopt_error_message())
        call shardopt_get_hparam(opt, 'lr', value, group=2, ierr=ierr)
        call check(ierr == 0 .and. abs(value - 0.03_c_double) < 1e-12_c_double, what//': get_hparam lr of group 2')
        call shardopt_get_hparam(opt, 'weight_decay', value, group=1, ierr=ierr)
        call check(ierr == 0 .and. abs(value - 0.02_c_double) < 1e-12_c_double, &
                   what//': get_hparam weight_decay of group 1')
        call shardopt_get_hparam(opt, 'lr', value, ierr=ierr)
        call check(ierr == 0 .and. abs(value - 0.05_c_double) < 1e-12_c_double, &
                   what//': get_hparam lr of group 1 (the default group) unchanged')
        lr(2) = 0.03_c_double
        wd(1) = 0.02_c_double
      end if
      call feed(opt, s)
      g = average(s)
      if (s == 3) then
        ref_norm = sqrt(sum(g**2))
        call shardopt_clip_grad_norm(opt, 0.5_c_double*ref_norm, norm, ierr)
        call check(ierr == 0, what//': clip_grad_norm: '//shardopt_error_message())
        call check_close([norm], [ref_norm], 1e-5_c_double, 0.0_c_double, what//': the global gradient norm')
        coef = min(1.0_c_double, 0.5_c_double*ref_norm/(ref_norm + 1e-6_c_double))
        g = g*coef
      end if
      call shardopt_step(opt, info, ierr)
      call check(ierr == 0 .and. info%applied == 1 .and. info%step == s, what//at//': step: '//shardopt_error_message())
      if (follow) then
        call reference_step(kind, s, g)
        call check_close(real(flat(), c_double), rp, RTOL, ATOL, what//at//' against the real(8) reference')
      end if
    end do
  end subroutine

  ! One run of NSTEPS steps from the same start. The stage-0 AdamW run's
  ! result is the one the other stages must equal bitwise; with
  ! `checkpoint`, a checkpoint saved after step 2 is loaded at the end and
  ! steps 3.. replayed, which must give the same parameters again.
  subroutine run(kind, stage, checkpoint)
    integer, intent(in) :: kind, stage
    logical, intent(in) :: checkpoint
    type(shardopt_params) :: params
    type(shardopt_optimizer) :: opt
    type(shardopt_memory_report_t) :: mem
    type(shardopt_load_report_t) :: report
    real(c_float) :: final(NTOTAL), state(5, 7)
    real(c_float), allocatable :: master(:)
    real(c_double) :: scale
    integer(c_int64_t) :: done, skipped, count
    integer :: ierr, n, dtype
    logical :: in_sync
    character(len=:), allocatable :: what, message, epoch
    what = label(kind, stage)
    call reset_reference()
    g2 = 0
    call new_params(params, ierr)
    call check(ierr == 0 .and. shardopt_params_count(params) == NPARAMS, what//': params_add')
    ! Small buckets: several per step, so that bucketing is exercised.
    call shardopt_optimizer_create(comm, params, specs(kind), opt, stage=stage, bucket_mb=2e-4_c_double, ierr=ierr)
    call check(ierr == 0, what//': optimizer_create: '//shardopt_error_message())
    if (ierr /= 0) return
    call shardopt_params_clear(params)

    call shardopt_num_params(opt, n, ierr)
    call check(ierr == 0 .and. n == NPARAMS, what//': num_params')
    call shardopt_param_info(opt, 2, count, dtype, ierr)
    call check(ierr == 0 .and. count == 35 .and. dtype == SHARDOPT_F32, what//': param_info of w2')

    if (checkpoint) then
      call steps(opt, kind, 1, 2, .true., what)
      call shardopt_save(opt, trim(ckpt), metadata_keys=[character(len=8) :: 'epoch', 'note'], &
                         metadata_values=[character(len=16) :: '7', 'from Fortran'], ierr=ierr)
      call check(ierr == 0, what//': save: '//shardopt_error_message())
      call steps(opt, kind, 3, NSTEPS, .true., what)
    else
      call steps(opt, kind, 1, NSTEPS, .true., what)
    end if
    final = flat()

    call shardopt_steps(opt, done, skipped, ierr)
    call check(ierr == 0 .and. done == NSTEPS .and. skipped == 0, what//': steps and skipped steps')
    call shardopt_loss_scale(opt, scale, ierr)
    call check(ierr == 0 .and. abs(scale - 1) < 1e-12_c_double, what//': loss scale 1 without a loss scaler')
    call shardopt_memory_report(opt, mem, ierr)
    call check(ierr == 0 .and. mem%allocated > 0 .and. mem%optimizer_state > 0, what//': memory_report')
    call shardopt_check_sync(opt, in_sync, message, ierr)
    call check(ierr == 0 .and. in_sync .and. len(message) == 0, what//': ranks in sync: '//message)
    ! The state, gathered from the shards: the reference's moments/buffers.
    call shardopt_gather_state(opt, merge('exp_avg        ', 'momentum_buffer', kind == ADAMW), 2, state, ierr)
    call check(ierr == 0, what//': gather_state: '//shardopt_error_message())
    call check_close(real([state], c_double), rm(38:72), 1e-4_c_double, 1e-6_c_double, &
                     what//': gathered state of w2 against the reference')
    if (kind == ADAMW) then
      call shardopt_gather_state(opt, 'exp_avg_sq', 2, state, ierr)
      call check_close(real([state], c_double), rv(38:72), 1e-4_c_double, 1e-9_c_double, &
                       what//': gathered exp_avg_sq of w2')
    end if
    allocate (master(37))
    call shardopt_gather_state(opt, 'master', 1, master, ierr)
    call check(ierr == 0 .and. same_bits(master, w1), what//': the master of real(4) w1 is w1, bitwise')

    if (kind == ADAMW) then
      if (stage == 0) then
        final0 = final
      else
        call check(same_bits(final, final0), what//': parameters bitwise equal to stage 0''s')
      end if
    end if

    if (checkpoint) then
      call shardopt_load(opt, trim(ckpt), report=report, ierr=ierr)
      call check(ierr == 0, what//': load: '//shardopt_error_message())
      call check(report%step == 2 .and. report%saved_ranks == world_size .and. report%hyper_parameters == 1 &
                 .and. report%missing == 0 .and. report%unexpected == 0, what//': load report')
      call shardopt_steps(opt, done, ierr=ierr)
      call check(done == 2, what//': 2 steps after loading the checkpoint of step 2')
      call shardopt_load_metadata(opt, 'epoch', epoch, ierr)
      call check(ierr == 0 .and. epoch == '7', what//': metadata epoch read back: '//epoch)
      call shardopt_load_metadata(opt, 'note', epoch, ierr)
      call check(ierr == 0 .and. epoch == 'from Fortran', what//': metadata note read back: '//epoch)
      lr = [0.05_c_double, 0.02_c_double]
      wd = [0.01_c_double, 0.0_c_double]
      call steps(opt, kind, 3, NSTEPS, .false., what//' replayed')
      call check(same_bits(flat(), final), what//': replay from the checkpoint gives the same parameters bitwise')
      call shardopt_export(opt, trim(export_path), ierr=ierr)
      call check(ierr == 0, what//': export: '//shardopt_error_message())
      call check(file_size(trim(export_path)) > NTOTAL*4, what//': the export holds the parameters')
      ! Shapes in C order: Fortran's w2(5, 7) is [7,5], as its bytes are.
      call check(shape_of(trim(export_path), 'w2') == '[7,5]', what//': export shape of w2(5,7): '// &
                 shape_of(trim(export_path), 'w2'))
      call check(shape_of(trim(export_path), 'w3') == '[2,4,3]', what//': export shape of w3(3,4,2): '// &
                 shape_of(trim(export_path), 'w3'))
      call check(shape_of(trim(export_path), 'w1') == '[37]', what//': export shape of w1(37): '// &
                 shape_of(trim(export_path), 'w1'))
    end if

    call shardopt_optimizer_destroy(opt, ierr)
    call check(ierr == 0 .and. .not. c_associated(opt%ptr), what//': destroy nulls the handle')
  end subroutine

  ! The "shape" of tensor `name` in a safetensors file's JSON header.
  function shape_of(path, name) result(shape_text)
    character(len=*), intent(in) :: path, name
    character(len=:), allocatable :: shape_text, header, entry
    integer(c_int64_t) :: n
    integer :: u, ios, at, close_at
    shape_text = '?'
    open (newunit=u, file=path, access='stream', form='unformatted', status='old', iostat=ios)
    if (ios /= 0) return
    read (u, iostat=ios) n
    if (ios /= 0 .or. n <= 0 .or. n > 1000000) then
      close (u)
      return
    end if
    allocate (character(len=int(n)) :: header)
    read (u, iostat=ios) header
    close (u)
    if (ios /= 0) return
    at = index(header, '"'//name//'":{')
    if (at == 0) return
    entry = header(at:)
    entry = entry(1:index(entry, '}'))
    at = index(entry, '"shape":')
    if (at == 0) return
    close_at = index(entry(at:), ']')
    shape_text = entry(at + 8:at + close_at - 1)
  end function

  integer(c_int64_t) function file_size(path)
    character(len=*), intent(in) :: path
    integer :: ios
    integer(c_int64_t) :: n
    n = -1
    inquire (file=path, size=n, iostat=ios)
    file_size = n
  end function

  subroutine test_bad_input()
    type(shardopt_params) :: params, other
    type(shardopt_optimizer) :: opt, copy
    real(c_float), target :: short(36), out(34)
    real(c_double) :: g8(37), value
    real(c_double), target :: w8(10)
    real(c_float), target :: v(10)
    integer :: ierr
    character(len=:), allocatable :: msg

    call reset_reference()
    call new_params(params, ierr)

    ! The parameter list refuses what the optimizer cannot take.
    call shardopt_params_add(params, 'w8', w8, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'parameter ''w8'' (number 5 of the list) is a real(8) array', 'params_add of real(8)')
    call shardopt_params_add(params, 'strided', w1(1:37:2), ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'not contiguous', &
                      'params_add of a strided section')
    call shardopt_params_add(params, '  ', v, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'the name is empty', &
                      'params_add without a name')
    call shardopt_params_add(params, 'v', v, group=0, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'group = 0 is not a group', &
                      'params_add to group 0')
    call shardopt_params_add(params, 'v', v, grad=short, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'has 10 elements but its grad array has 36', 'params_add with a grad of another size')
    call check(shardopt_params_count(params) == NPARAMS, 'refused arrays are not added')

    ! Creation: a group without a spec, an unknown optimizer, a bad stage.
    call shardopt_params_add(other, 'v', v, group=3)
    call shardopt_optimizer_create(comm, other, specs(SGD), opt, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'parameter ''v'' is in group 3, but 2 optimizer spec(s) were given', 'a group without a spec')
    call shardopt_optimizer_create(comm, params, [character(len=16) :: 'adamx lr=1', 'adamx lr=1'], opt, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'adamx', &
                      'an unknown optimizer')
    call check(.not. c_associated(opt%ptr), 'a failed creation leaves a null handle')
    call shardopt_optimizer_create(comm, params, specs(ADAMW), opt, stage=4, ierr=ierr)
    call check_fails(ierr, shardopt_error_message(), 'stage', 'stage 4 is refused')
    ! Options are named by the keyword arguments that set them.
    call check_fortran_words(ierr, shardopt_error_message(), 'stage= of shardopt_optimizer_create is 4', &
                             'stage 4 is named by its keyword')
    call shardopt_optimizer_create(comm, params, specs(ADAMW), opt, bucket_mb=-1.0_c_double, ierr=ierr)
    call check_fortran_words(ierr, shardopt_error_message(), 'bucket_mb= of shardopt_optimizer_create is -1', &
                             'bucket_mb -1 is named by its keyword')
    call shardopt_params_clear(other)
    call shardopt_params_add(other, 'same', v)
    call shardopt_params_add(other, 'same', w1)
    call shardopt_optimizer_create(comm, other, 'sgd lr=0.1', opt, ierr=ierr)
    call check_fails(ierr, shardopt_error_message(), 'same', 'two parameters of one name are refused')

    call shardopt_optimizer_create(comm, params, specs(ADAMW), opt, ierr=ierr)
    call check(ierr == 0, 'optimizer_create: '//shardopt_error_message())

    ! A gradient marked ready twice: named by its number from 1, in the
    ! words of the call that marks it.
    call shardopt_zero_grad(opt)
    call shardopt_grad_ready(opt, 2, ierr=ierr)
    call check(ierr == 0, 'grad_ready of w2: '//shardopt_error_message())
    call shardopt_grad_ready(opt, 2, ierr=ierr)
    call check_fortran_words(ierr, shardopt_error_message(), &
                             'shardopt_grad_ready(opt, 2) (''w2'') was called twice', &
                             'grad_ready of w2 twice names parameter 2')

    ! Gradients of the wrong size or type, and parameter numbers that do
    ! not exist, then the right call: the step is still the reference's.
    call shardopt_zero_grad(opt)
    call shardopt_grad_ready(opt, 1, short, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'shardopt_grad_ready: parameter 1 (''w1'') has 37 elements but the gradient passed has 36', &
                      'grad_ready with a gradient of the wrong size')
    g8 = 1
    call shardopt_grad_ready(opt, 1, g8, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'is real(4) (f32) but the gradient passed is real(8)', 'grad_ready with a real(8) gradient')
    call shardopt_grad_ready(opt, 0, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'parameter 0 does not exist: the optimizer has 4 parameters', 'grad_ready of parameter 0')
    call shardopt_grad_ready(opt, 5, short(1:35), ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'numbered from 1 to 4', 'grad_ready of parameter 5')
    call feed(opt, 1)
    call shardopt_step(opt, ierr=ierr)
    call check(ierr == 0, 'step after the mistakes: '//shardopt_error_message())
    call reference_step(ADAMW, 1, average(1))
    call check_close(real(flat(), c_double), rp, RTOL, ATOL, 'the step after the mistakes is the reference''s')

    ! Gathering into an array of the wrong size, or an unknown state.
    call shardopt_gather_state(opt, 'exp_avg', 2, out, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'parameter 2 (''w2'') has 35 elements but out has 34', 'gather_state into a short array')
    call shardopt_gather_state(opt, 'bogus', 1, w1, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'bogus', &
                      'gather_state of an unknown state')

    ! Groups that do not exist; a bad hyper-parameter changes nothing.
    call shardopt_set_lr(opt, 0.1_c_double, group=3, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'group 3 does not exist: the optimizer has 2 parameter group(s)', 'set_lr of group 3')
    call shardopt_set_lr(opt, 0.1_c_double, group=0, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'group 0 does not exist', &
                      'set_lr of group 0')
    call shardopt_set_hparams(opt, 'lr=0.5 bogus=1', group=1, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'bogus', &
                      'set_hparams with an unknown name')
    call shardopt_get_hparam(opt, 'lr', value, group=1, ierr=ierr)
    call check(ierr == 0 .and. abs(value - 0.05_c_double) < 1e-12_c_double, 'a refused set_hparams changes nothing')
    call shardopt_get_hparam(opt, 'nope', value, ierr=ierr)
    call check(ierr == SHARDOPT_ERR_INVALID_ARGUMENT, 'get_hparam of an unknown name: '//shardopt_error_message())
    call shardopt_save(opt, trim(ckpt), metadata_keys=['a', 'b'], metadata_values=['1'], ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      '2 metadata_keys but 1 metadata_values', 'save with unpaired metadata')
    call shardopt_load(opt, 'fortran-no-such-checkpoint.ckpt', ierr=ierr)
    call check_fails(ierr, shardopt_error_message(), 'fortran-no-such-checkpoint', 'load of a missing file')

    ! The communicator cannot go while the optimizer lives.
    call shardopt_comm_destroy(comm, ierr)
    call check(ierr == SHARDOPT_ERR_INVALID_STATE .and. c_associated(comm%ptr), &
               'comm_destroy with a live optimizer is refused: '//shardopt_error_message())

    ! After destroy: the variable (null) and a copy kept elsewhere.
    copy = opt
    call shardopt_optimizer_destroy(opt, ierr)
    call check(ierr == 0 .and. .not. c_associated(opt%ptr), 'destroy')
    call shardopt_zero_grad(opt, ierr)
    msg = shardopt_error_message()
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, msg, 'shardopt_zero_grad: opt is NULL', &
                      'zero_grad after destroy')
    call shardopt_grad_ready(opt, 1, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'shardopt_grad_ready: opt', &
                      'grad_ready after destroy')
    call shardopt_step(copy, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'was destroyed', &
                      'step on a copy of a destroyed optimizer')
    call shardopt_set_lr(copy, 0.1_c_double, group=1, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'shardopt_set_lr', &
                      'set_lr on a copy of a destroyed optimizer')
    call shardopt_optimizer_destroy(opt, ierr)
    call check(ierr == 0, 'destroying a null optimizer again is accepted')
  end subroutine

  ! Stage 2 with two micro-batches per step, reduced by reduce_gradients:
  ! the step takes the sum of the micro-batches' averaged gradients.
  subroutine test_microbatches()
    type(shardopt_params) :: params
    type(shardopt_optimizer) :: opt
    integer :: ierr, s
    character(len=8) :: at
    call reset_reference()
    call new_params(params, ierr)
    call shardopt_optimizer_create(comm, params, specs(SGD), opt, stage=2, bucket_mb=2e-4_c_double, ierr=ierr)
    call check(ierr == 0, 'micro-batches: optimizer_create: '//shardopt_error_message())
    do s = 1, 2
      write (at, '(a,i0)') ' step ', s
      call shardopt_zero_grad(opt)
      call feed(opt, s)
      call shardopt_reduce_gradients(opt, ierr)
      call check(ierr == 0, 'micro-batches: reduce_gradients: '//shardopt_error_message())
      call feed(opt, s + 50)
      call shardopt_step(opt, ierr=ierr)
      call check(ierr == 0, 'micro-batches: step: '//shardopt_error_message())
      call reference_step(SGD, s, average(s) + average(s + 50))
      call check_close(real(flat(), c_double), rp, RTOL, ATOL, 'stage 2, two micro-batches,'//at// &
                       ' against the reference')
    end do
    call shardopt_optimizer_destroy(opt)
  end subroutine

  ! Stage 3 against stage 2 with the same units (w1 and w2 unit 1; w3 and
  ! the empty array unit 2): each step gathers unit 1 ahead (igather),
  ! reads its parameters through shardopt_param_data to form gradients that
  ! depend on them, releases it, then gathers and releases unit 2. The
  ! parameters after NSTEPS steps, gathered at stage 3 and the arrays at
  ! stage 2, are bitwise equal, and so are they after a stage-3 checkpoint
  ! is loaded at stage 2. Then misuse: each an error with its message.
  subroutine test_stage3()
    type(shardopt_optimizer) :: opt
    type(shardopt_zero_options_t) :: options
    type(shardopt_memory_report_t) :: mem
    type(shardopt_step_info_t) :: info
    real(c_float) :: final2(NTOTAL), final3(NTOTAL)
    real(c_float), pointer :: p(:)
    character(len=64) :: path
    integer :: stage, s, ierr, n
    logical :: in_sync

    write (path, '(a,i0,a)') 'fortran-stage3-np', world_size, '.ckpt'
    options = stage3_options()
    do stage = 2, 3
      call new_units_optimizer(opt, stage, options)
      if (.not. c_associated(opt%ptr)) return
      do s = 1, NSTEPS
        call shardopt_zero_grad(opt)
        if (stage == 3) then
          call shardopt_igather_unit(opt, 1, ierr)
          call check(ierr == 0, 'stage 3: igather_unit(1): '//shardopt_error_message())
        end if
        call units_grads(opt, s, 1)
        if (stage == 3) then
          call shardopt_release_unit(opt, 1, ierr)
          call check(ierr == 0, 'stage 3: release_unit(1): '//shardopt_error_message())
          call shardopt_param_data(opt, 1, p, ierr)
          call check(ierr == 0 .and. .not. associated(p), 'stage 3: param_data of a released unit is not associated')
          call shardopt_gather_unit(opt, 2)
        end if
        call units_grads(opt, s, 2)
        if (stage == 3) call shardopt_release_unit(opt, 2)
        call shardopt_step(opt, info, ierr)
        call check(ierr == 0 .and. info%applied == 1, 'stage 3 units: step: '//shardopt_error_message())
        if (stage == 3) call check(info%gathers == 2, 'stage 3: the step counts its two gathers')
      end do
      if (stage == 2) then
        final2 = flat()
        call shardopt_optimizer_destroy(opt)
        cycle
      end if
      final3 = gathered(opt)
      call check(same_bits(final3, final2), 'stage 3 (units) bitwise equal to stage 2 with the same units')
      call shardopt_num_units(opt, n, ierr)
      call check(ierr == 0 .and. n == 2, 'stage 3: num_units is 2')
      call shardopt_memory_report(opt, mem, ierr)
      call check(ierr == 0 .and. mem%param_shard > 0 .and. mem%gather_pool > 0 .and. mem%user_params == 0, &
                 'stage 3: the memory report has the parameter shard and the pool, no user parameters')
      call shardopt_check_sync(opt, in_sync, ierr=ierr)
      call check(ierr == 0 .and. in_sync, 'stage 3: check_sync: '//shardopt_error_message())
      call shardopt_save(opt, path, ierr=ierr)
      call check(ierr == 0, 'stage 3: save: '//shardopt_error_message())
      call stage3_misuse(opt)
      call shardopt_optimizer_destroy(opt)
    end do

    ! The stage-3 checkpoint at stage 2: the arrays take its parameters.
    w1 = 0
    w2 = 0
    w3 = 0
    call new_units_optimizer(opt, 2, options)
    call shardopt_load(opt, path, ierr=ierr)
    call check(ierr == 0, 'stage 2: load of a stage-3 checkpoint: '//shardopt_error_message())
    call check(same_bits(flat(), final3), 'a stage-3 checkpoint loaded at stage 2 gives its parameters bitwise')
    call shardopt_optimizer_destroy(opt)
    call shardopt_barrier_world()
    if (world_rank == 0) call remove(path)
  end subroutine

  ! Units of a few hundred bytes: none kept whole, gathers through the pool.
  function stage3_options() result(o)
    type(shardopt_zero_options_t) :: o
    integer :: ierr
    call shardopt_zero_options_init(o, ierr)
    o%persist_below_bytes = 0
    o%bucket_mb = 2e-4_c_double
  end function

  subroutine new_units_optimizer(opt, stage, options)
    type(shardopt_optimizer), intent(out) :: opt
    integer, intent(in) :: stage
    type(shardopt_zero_options_t), intent(in) :: options
    type(shardopt_params) :: params
    integer :: ierr
    call reset_reference()
    g2 = 0
    call shardopt_params_add(params, 'w1', w1, unit=1)
    call shardopt_params_add(params, 'w2', w2, grad=g2, unit=1)
    call shardopt_params_add(params, 'w3', w3, unit=2)
    call shardopt_params_add(params, 'empty', wz, unit=2)
    call shardopt_optimizer_create(comm, params, 'adamw lr=0.05 betas=0.9,0.999 eps=1e-8 weight_decay=0.01', opt, &
                                   options=options, stage=stage, ierr=ierr)
    call check(ierr == 0, 'units at stage '//achar(48 + stage)//': optimizer_create: '//shardopt_error_message())
    call shardopt_params_clear(params)
  end subroutine

  ! The gradients of unit u's parameters at step s: this rank's values plus
  ! a tenth of the parameter itself, read through shardopt_param_data.
  subroutine units_grads(opt, s, u)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: s, u
    real(c_float), pointer :: p(:)
    integer :: k, ierr
    do k = 2*u - 1, 2*u
      call shardopt_param_data(opt, k, p, ierr)
      call check(ierr == 0, 'param_data: '//shardopt_error_message())
      if (sizes(k) == 0) then
        call check(.not. associated(p), 'param_data of an empty parameter is not associated')
        call shardopt_grad_ready(opt, k)
        cycle
      end if
      call check(associated(p), 'param_data of a gathered unit is associated')
      if (.not. associated(p)) return
      call shardopt_grad_ready(opt, k, grad_of(world_rank, s, k) + 0.1_c_float*p)
    end do
  end subroutine

  ! Every parameter's values, each unit gathered and released in turn.
  function gathered(opt) result(v)
    type(shardopt_optimizer), intent(in) :: opt
    real(c_float) :: v(NTOTAL)
    real(c_float), pointer :: p(:)
    integer :: u, k
    v = 0
    do u = 1, 2
      call shardopt_gather_unit(opt, u)
      do k = 2*u - 1, 2*u
        call shardopt_param_data(opt, k, p)
        if (sizes(k) > 0) v(offset(k) + 1:offset(k) + sizes(k)) = p
      end do
      call shardopt_release_unit(opt, u)
    end do
  end function

  ! Misuse of units: an error on every rank, in Fortran's numbering.
  subroutine stage3_misuse(opt)
    type(shardopt_optimizer), intent(in) :: opt
    type(shardopt_params) :: params
    real(c_float), target :: v(3)
    integer :: ierr
    call shardopt_release_unit(opt, 1, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'has not gathered the unit', &
                      'release_unit without a gather')
    call shardopt_gather_unit(opt, 0, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), '(0): there are 2 units', &
                      'gather_unit(0): units are numbered from 1')
    call shardopt_gather_unit(opt, 3, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), '(3): there are 2 units', &
                      'gather_unit past the units')
    call shardopt_gather_unit(opt, 1, ierr)
    call check(ierr == 0, 'gather_unit after errors: '//shardopt_error_message())
    call shardopt_gather_unit(opt, 1, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'gathered already', &
                      'a second gather_unit of a gathered unit')
    call shardopt_step(opt, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_STATE, shardopt_error_message(), 'still gathered', &
                      'step with a unit gathered')
    call shardopt_release_unit(opt, 1, ierr)
    call check(ierr == 0, 'release_unit after errors: '//shardopt_error_message())
    call shardopt_params_add(params, 'v', v, unit=-1, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'unit = -1 is negative', &
                      'params_add with a negative unit')
  end subroutine

  ! The options struct (its layout is the C struct's): a loss scaler's
  ! initial scale set through it, the keyword taking precedence.
  subroutine test_options()
    type(shardopt_params) :: params
    type(shardopt_optimizer) :: opt
    type(shardopt_zero_options_t) :: options
    real(c_float), target :: v(10)
    real(c_double) :: scale
    integer :: ierr
    v = 1
    call shardopt_params_add(params, 'v', v)
    call shardopt_zero_options_init(options, ierr)
    call check(ierr == 0 .and. options%stage == 1 .and. abs(options%init_scale - 65536) < 1e-9_c_double .and. &
               options%growth_interval == 2000, 'zero_options_init gives the defaults')
    options%loss_scaler = 1
    options%init_scale = 1024
    options%stage = 2
    call shardopt_optimizer_create(comm, params, 'sgd lr=0.1', opt, options=options, ierr=ierr)
    call shardopt_loss_scale(opt, scale, ierr)
    call check(ierr == 0 .and. abs(scale - 1024) < 1e-9_c_double, 'options%init_scale reaches the loss scaler')
    call shardopt_optimizer_destroy(opt)
    call shardopt_optimizer_create(comm, params, 'sgd lr=0.1', opt, options=options, loss_scaler=.false., ierr=ierr)
    call shardopt_loss_scale(opt, scale, ierr)
    call check(ierr == 0 .and. abs(scale - 1) < 1e-9_c_double, 'the loss_scaler keyword overrides options')
    call shardopt_optimizer_destroy(opt)
  end subroutine

  ! bf16 parameters as integer(2) bits: 1.0 - 0.5 * 1.0 = 0.5 exactly.
  subroutine test_half()
    integer(c_int16_t), parameter :: ONE = int(z'3F80', c_int16_t), HALF = int(z'3F00', c_int16_t)
    integer(c_int16_t), target :: h(6), hg(6)
    real(c_float), target :: wrong(6)
    integer(c_int16_t), pointer :: owned(:)
    real(c_float), pointer :: owned4(:)
    type(shardopt_params) :: params
    type(shardopt_optimizer) :: opt
    integer :: ierr, dtype
    h = ONE
    hg = ONE
    call shardopt_params_add(params, 'h', h, SHARDOPT_F32, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'integer(2) array with dtype = 0', 'an integer(2) array as f32')
    call shardopt_params_add(params, 'h', h, SHARDOPT_BF16, ierr=ierr)
    call check(ierr == 0, 'params_add of bf16 bits: '//shardopt_error_message())
    call shardopt_optimizer_create(comm, params, 'sgd lr=0.5', opt, ierr=ierr)
    call check(ierr == 0, 'optimizer on bf16 parameters: '//shardopt_error_message())
    call shardopt_param_info(opt, 1, dtype=dtype, ierr=ierr)
    call check(ierr == 0 .and. dtype == SHARDOPT_BF16, 'param_info says bf16')
    call shardopt_grad_ready(opt, 1, wrong, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'is integer(2) bf16 bits but the gradient passed is real(4) (f32)', 'a real(4) gradient for bf16')
    call shardopt_param_grad(opt, 1, owned4, ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'is integer(2) bf16 bits, not real(4)', 'a real(4) pointer to a bf16 gradient')
    call shardopt_param_grad(opt, 1, owned, ierr)
    call check(ierr == 0 .and. associated(owned), 'an integer(2) pointer to the bf16 gradient')
    call shardopt_grad_ready(opt, 1, hg, ierr)
    call check(ierr == 0, 'grad_ready with bf16 bits: '//shardopt_error_message())
    call shardopt_step(opt, ierr=ierr)
    call check(ierr == 0 .and. all(h == HALF), 'bf16 SGD step: 1 - 0.5 * 1 = 0.5 exactly')
    call shardopt_optimizer_destroy(opt)
  end subroutine

  ! The functional step against the real(8) reference of torch's Adam.
  subroutine test_functional()
    integer, parameter :: n = 50
    real(c_float) :: p(n), g(n), st(n, 3), bad(n - 1, 3), two(n, 2)
    real(c_double) :: m(n), v(n), q(n), gd(n), bc1, bc2
    integer :: slots, ierr, s, i
    logical :: applied, finite
    character(len=:), allocatable :: name
    call shardopt_functional_slots('adam lr=0.01', slots, ierr)
    call check(ierr == 0 .and. slots == 3, 'adam has 3 state slots')
    call shardopt_functional_slot_name('adam', 2, name, ierr)
    call check(ierr == 0 .and. name == 'exp_avg_sq', 'slot 2 of adam is exp_avg_sq: '//name)
    call shardopt_functional_slots('sgd momentum=0.9', slots, ierr)
    call check(ierr == 0 .and. slots == 1, 'sgd has 1 state slot')
    q = [(uval(7, 0, 0, i), i=1, n)]
    p = real(q, c_float)
    st = 0
    m = 0
    v = 0
    do s = 1, 3
      g = [(real(uval(world_rank, s, 9, i), c_float), i=1, n)]
      gd = real(g, c_double)
      call shardopt_functional_step('adam lr=0.01', p, g, st, s, applied, finite, ierr=ierr)
      call check(ierr == 0 .and. applied .and. finite, 'functional adam step: '//shardopt_error_message())
      m = 0.9_c_double*m + 0.1_c_double*gd
      v = 0.999_c_double*v + 0.001_c_double*gd**2
      bc1 = 1 - 0.9_c_double**s
      bc2 = 1 - 0.999_c_double**s
      q = q - 0.01_c_double/bc1*m/(sqrt(v)/sqrt(bc2) + 1e-8_c_double)
    end do
    call check_close(real(p, c_double), q, RTOL, ATOL, 'functional adam against the reference')
    call check_close(real(st(:, 1), c_double), m, 1e-5_c_double, 1e-7_c_double, 'functional adam exp_avg')
    call check(maxval(abs(st(:, 3))) <= 0, 'without amsgrad the max_exp_avg_sq column is left alone')
    ! amsgrad uses the third column; RMSprop centered without momentum
    ! uses the first two of its three (square_avg, grad_avg).
    call shardopt_functional_step('adam lr=0.01 amsgrad=true', p, g, st, 4, ierr=ierr)
    call check(ierr == 0 .and. any(st(:, 3) > 0), 'adam with amsgrad fills max_exp_avg_sq: '//shardopt_error_message())
    st = 0
    call shardopt_functional_step('rmsprop lr=0.01 centered=true', p, g, st, 1, ierr=ierr)
    call check(ierr == 0 .and. any(st(:, 1) > 0) .and. maxval(abs(st(:, 2))) > 0 .and. &
               maxval(abs(st(:, 3))) <= 0, &
               'rmsprop centered without momentum: square_avg and grad_avg, no momentum_buffer: '// &
               shardopt_error_message())
    bad = 0
    call shardopt_functional_step('adam', p, g, bad, 4, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'states has 49 rows but params has 50 elements', 'functional step with short states')
    two = 0
    call shardopt_functional_step('adam', p, g, two, 4, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), 'adam takes 3 state buffers', &
                      'functional step with too few states')
    call shardopt_functional_step('adam', p, g(1:n - 1), st, 4, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_INVALID_ARGUMENT, shardopt_error_message(), &
                      'grads has 49 elements but params has 50', 'functional step with short grads')
  end subroutine

  ! A NaN in element 4 of parameter 1 with non_finite = error: the
  ! message counts both from 1, as the module does.
  subroutine test_non_finite()
    real(c_float), target :: p(10), g(10)
    type(shardopt_params) :: params
    type(shardopt_optimizer) :: opt
    integer :: ierr
    p = 1
    g = 0.5
    g(4) = ieee_value(g(4), ieee_quiet_nan)
    call shardopt_params_add(params, 'w', p, ierr=ierr)
    call check(ierr == 0, 'params_add: '//shardopt_error_message())
    call shardopt_optimizer_create(comm, params, 'sgd lr=0.1', opt, stage=2, &
                                   non_finite=SHARDOPT_NON_FINITE_ERROR, ierr=ierr)
    call check(ierr == 0, 'optimizer with non_finite = error: '//shardopt_error_message())
    call shardopt_grad_ready(opt, 1, g, ierr)
    call check(ierr == 0, 'grad_ready of the NaN gradient: '//shardopt_error_message())
    call shardopt_step(opt, ierr=ierr)
    call check_status(ierr, SHARDOPT_ERR_NON_FINITE, shardopt_error_message(), &
                      '''w'' (index 1) is nan at element 4 ', 'a NaN named from 1')
    call check(maxval(abs(p - 1)) <= 0, 'nothing updated after the NaN')
    call shardopt_optimizer_destroy(opt)
  end subroutine

end program test_fortran_zero
