"""The specifics of shardopt's Fortran generics over array kinds.

The module's generic procedures (shardopt_allreduce, shardopt_params_add,
...) take arrays of several types and ranks. Each specific only turns its
array into an address, a size and a dtype for a procedure of the module
that serves every kind, so the specifics differ in their names and
declarations alone: each is written here once, as a template, and expanded
for every kind (and rank) it serves.

module_source.py writes them into the module: the generic interfaces in
place of its line include 'kind_interfaces.inc', the specifics in place of
include 'kind_wrappers.inc'.

A template is Fortran with str.format fields: {name} (the specific's
name), {k}, {type}, {dtype} and {bytes} (the kind's row of KINDS, unless
the emit() call sets one), {dims} (the array's shape, (:) to (:, :, :))
and the emit() call's own. A line that ends in "!@ k1 k2 ..." is written
for those kinds only. To add a kind: a row of KINDS, then its suffix in
the emit() calls of the generics that take it. To add a generic over
kinds: a template and an emit() call.
"""

import re
import textwrap

# Suffix of the specifics' names: Fortran type, the C API's dtype, bytes
# per element.
KINDS = {
    "r4": ("real(c_float)", "SHARDOPT_F32", 4),
    "r8": ("real(c_double)", "SHARDOPT_F64", 8),
    "i4": ("integer(c_int32_t)", "SHARDOPT_I32", 4),
    "i8": ("integer(c_int64_t)", "SHARDOPT_I64", 8),
    # 16-bit floating-point parameters, as the bits of bf16 or f16 values.
    "h": ("integer(c_int16_t)", "SHARDOPT_BF16", 2),
}
NUMBERS = ("r4", "r8", "i4", "i8")  # what the collectives take
RANKS = (1, 2, 3)  # of parameter, gradient and state arrays
DIMS = {1: "(:)", 2: "(:, :)", 3: "(:, :, :)"}

ADDR = """
  function {name}(a) result(p)
    {type}, intent(in), target, contiguous :: a(:)
    type(c_ptr) :: p
    p = c_null_ptr
    if (size(a) > 0) p = c_loc(a)
  end function
"""

COLLECTIVE = """
  subroutine {name}(comm, send, recv, count{extra}, ierr)
    type(shardopt_comm), intent(in) :: comm
    {type}, intent(in), target, contiguous :: send(:)
    {type}, intent(inout), target, contiguous :: recv(:)
    integer, intent(in) :: count{extra}
    integer, intent(out), optional :: ierr
    call collective({what}, comm, addr_{k}(send), size(send), addr_{k}(recv), size(recv), .false., &
                    {bytes}, count, {dtype}, {op}, ierr)
  end subroutine
"""

COLLECTIVE_IN_PLACE = """
  subroutine {name}(comm, buf, count{extra}, ierr)
    type(shardopt_comm), intent(in) :: comm
    {type}, intent(inout), target, contiguous :: buf(:)
    integer, intent(in) :: count{extra}
    integer, intent(out), optional :: ierr
    call collective({what}, comm, addr_{k}(buf), size(buf), addr_{k}(buf), size(buf), .true., &
                    {bytes}, count, {dtype}, {op}, ierr)
  end subroutine
"""

# data and grad have no contiguous attribute: a strided section must reach
# add_entry as itself, to be refused, not as a contiguous copy whose
# address would outlive it.
PARAMS_ADD = """
  subroutine {name}(params, name, data, grad, group, ierr, unit)  !@ r4
  subroutine {name}(params, name, data, dtype, grad, group, ierr, unit)  !@ h
    type(shardopt_params), intent(inout) :: params
    character(len=*), intent(in) :: name
    {type}, intent(inout), target :: data{dims}
    integer, intent(in) :: dtype  !@ h
    {type}, intent(inout), target, optional :: grad{dims}
    integer, intent(in), optional :: group
    integer, intent(out), optional :: ierr
    integer, intent(in), optional :: unit
    type(c_ptr) :: d, g
    logical :: gc
    integer(c_size_t) :: gn
    if (.not. half_dtype_ok(name, dtype, ierr)) return  !@ h
    d = c_null_ptr
    g = c_null_ptr
    gc = .true.
    gn = 0
    if (is_contiguous(data) .and. size(data) > 0) d = c_loc(data)
    if (present(grad)) then
      gc = is_contiguous(grad)
      gn = size(grad, kind=c_size_t)
      if (gc .and. size(grad) > 0) g = c_loc(grad)
    end if
    call add_entry(params, name, d, is_contiguous(data), size(data, kind=c_size_t), shape(data, kind=c_size_t), &
                   {dtype}, present(grad), g, gc, gn, group, ierr, unit)
  end subroutine
"""

PARAMS_ADD_REFUSED = """
  subroutine {name}(params, name, data, grad, group, ierr, unit)
    type(shardopt_params), intent(inout) :: params
    character(len=*), intent(in) :: name
    {type}, intent(in) :: data{dims}
    {type}, intent(in), optional :: grad{dims}
    integer, intent(in), optional :: group
    integer, intent(out), optional :: ierr
    integer, intent(in), optional :: unit
    integer :: n
    n = size(data)
    if (present(grad)) n = max(n, size(grad))
    call refuse_real8(name, params%n + 1, n, group, unit, ierr)
  end subroutine
"""

GRAD_READY = """
  subroutine {name}(opt, i, grad, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    {type}, intent(in), target, contiguous :: grad{dims}
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    p = c_null_ptr
    if (size(grad) > 0) p = c_loc(grad)
    call grad_ready_array(opt, i, p, size(grad, kind=c_size_t), {dtype}, ierr)
  end subroutine
"""

# {arg}: grad (shardopt_param_grad) or data (shardopt_param_data).
PARAM_BUFFER = """
  subroutine {name}(opt, i, {arg}, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    integer, intent(in) :: i
    {type}, pointer, intent(out) :: {arg}(:)
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_size_t) :: n
    nullify ({arg})
    if (.not. param_buffer(opt, i, {dtype}, '{arg}', p, n, ierr)) return
    if (c_associated(p) .and. n > 0) call c_f_pointer(p, {arg}, [n])
  end subroutine
"""

GATHER_STATE = """
  subroutine {name}(opt, name, i, out, ierr)
    type(shardopt_optimizer), intent(in) :: opt
    character(len=*), intent(in) :: name
    integer, intent(in) :: i
    {type}, intent(inout), target, contiguous :: out{dims}
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    p = c_null_ptr
    if (size(out) > 0) p = c_loc(out)
    call gather_state_into(opt, name, i, p, size(out, kind=c_size_t), ierr)
  end subroutine
"""

KIND_FILTER = re.compile(r"\s*!@((?: \w+)+)$")

generics = {}  # generic name: one list of specifics per emit() call
procedures = []


def emit(generic, name, template, kinds, ranks=(1,), doc="", **fields):
    """Expands template for every kind and rank, as specifics of generic
    (None: private helpers), after doc (Fortran comment lines). name is a
    pattern with the template's fields."""
    names = []
    text = doc
    for k in kinds:
        for rank in ranks:
            values = dict(zip(("type", "dtype", "bytes"), KINDS[k]), k=k, rank=rank, dims=DIMS[rank])
            values.update(fields)
            values["name"] = name.format(**values)
            names.append(values["name"])
            for line in template.format(**values).lstrip("\n").splitlines(keepends=True):
                only = KIND_FILTER.search(line)
                if not only:
                    text += line
                elif k in only.group(1).split():
                    text += line[: only.start()] + "\n"
            text += "\n"
    procedures.append(text)
    if generic:
        generics.setdefault(generic, []).append(names)


def interfaces():
    text = ""
    for generic, lists in generics.items():
        text += "  interface " + generic + "\n"
        for names in lists:
            lines = textwrap.wrap("module procedure " + ", ".join(names), 100, initial_indent="    ",
                                  subsequent_indent="      ", break_on_hyphens=False)
            text += " &\n".join(lines) + "\n"
        text += "  end interface\n\n"
    return text


emit(None, "addr_{k}", ADDR, NUMBERS, doc="""\
  ! The address of a contiguous array, NULL when it is empty (c_loc needs
  ! a non-empty array).
""")
emit("shardopt_allreduce", "allreduce_{k}", COLLECTIVE, NUMBERS,
     what="OP_ALLREDUCE", extra=", op", op="op", doc="""\
  !> Collective: recv(1:count) = op over ranks of send(1:count).
""")
emit("shardopt_allreduce", "allreduce_{k}_in", COLLECTIVE_IN_PLACE, NUMBERS,
     what="OP_ALLREDUCE", extra=", op", op="op", doc="""\
  !> Collective, in place: buf(1:count) = op over ranks of buf(1:count).
""")
emit("shardopt_reduce_scatter", "reduce_scatter_{k}", COLLECTIVE, NUMBERS,
     what="OP_REDUCE_SCATTER", extra=", op", op="op", doc="""\
  !> Collective: recv(1:count) = op over ranks of this rank's block of send
  !> (send holds count * ranks elements; rank r's block starts at r*count+1).
""")
emit("shardopt_reduce_scatter", "reduce_scatter_{k}_in", COLLECTIVE_IN_PLACE, NUMBERS,
     what="OP_REDUCE_SCATTER", extra=", op", op="op", doc="""\
  !> Collective, in place (MPI's form): buf holds count * ranks elements;
  !> this rank's reduced block is written to buf(1:count).
""")
emit("shardopt_allgather", "allgather_{k}", COLLECTIVE, NUMBERS,
     what="OP_ALLGATHER", extra="", op="0", doc="""\
  !> Collective: recv(r*count+1 : (r+1)*count) = rank r's send(1:count).
""")
emit("shardopt_allgather", "allgather_{k}_in", COLLECTIVE_IN_PLACE, NUMBERS,
     what="OP_ALLGATHER", extra="", op="0", doc="""\
  !> Collective, in place: buf holds count * ranks elements; this rank's
  !> block is read from its place, buf(rank*count+1 : (rank+1)*count).
""")
emit("shardopt_broadcast", "broadcast_{k}", COLLECTIVE_IN_PLACE, NUMBERS,
     what="OP_BROADCAST", extra=", root", op="root", doc="""\
  !> Collective: buf(1:count) of rank `root` (from 0) on every rank.
""")

# The optimizer keeps f32 master values and takes f32, bf16 and f16
# parameters; real(8) arrays are accepted only to be refused with a message.
emit("shardopt_params_add", "params_add_{k}_{rank}", PARAMS_ADD, ("r4",), RANKS, doc="""\
  !> Adds a real(4) array to the parameter list, under a unique name, in
  !> parameter group `group` (from 1; default 1). The array (and grad, the
  !> gradient array the code writes, if given; otherwise the optimizer keeps
  !> one) must be contiguous, have the target attribute and outlive the
  !> optimizer: the optimizer updates it in place (at stages 0-2; stage 3
  !> reads it once, at creation). `unit` (stage 3, docs/zero.md):
  !> consecutive arrays with one number (from 1) form a unit; absent or 0,
  !> the array is a unit of its own.
""")
emit("shardopt_params_add", "params_add_{k}_{rank}", PARAMS_ADD, ("h",), RANKS,
     dtype="dtype", doc="""\
  !> Adds an integer(2) array holding bf16 or f16 values (dtype
  !> SHARDOPT_BF16 or SHARDOPT_F16); as for real(4) arrays otherwise.
""")
emit("shardopt_params_add", "params_add_{k}_{rank}", PARAMS_ADD_REFUSED, ("r8",), RANKS, doc="""\
  !> real(8) arrays are refused with a message (the optimizer works in f32).
""")

emit("shardopt_grad_ready", "grad_ready_{k}_{rank}", GRAD_READY, ("r4",), RANKS, doc="""\
  !> Local: parameter i's gradient (from 1) is complete, in `grad` (any
  !> shape of the parameter's size and type), which is copied before the
  !> call returns.
""")
# An integer(2) gradient is of the parameter's own 16-bit dtype.
emit("shardopt_grad_ready", "grad_ready_{k}_{rank}", GRAD_READY, ("h",), RANKS,
     dtype="half_of(opt, i)")
emit("shardopt_grad_ready", "grad_ready_{k}_{rank}", GRAD_READY, ("r8",), RANKS, doc="""\
  ! real(8) gradients never match a parameter: reported with the
  ! parameter's type.
""")

emit("shardopt_param_grad", "param_grad_{k}", PARAM_BUFFER, ("r4", "h"), arg="grad", doc="""\
  !> Local: points grad at parameter i's gradient buffer (from 1), the
  !> registered or owned one, to write the gradient in place before
  !> shardopt_grad_ready(opt, i). Not associated for a streamed gradient
  !> (stage 2 with stream_grads) or an empty parameter.
""")
emit("shardopt_param_data", "param_data_{k}", PARAM_BUFFER, ("r4", "h"), arg="data", doc="""\
  !> Local: points data at parameter i's whole values (from 1): the added
  !> array at stages 0-2; at stage 3 inside its gathered unit (waiting for a
  !> shardopt_igather_unit), not associated while the unit is released.
  !> Read it, do not write it: a write does not reach the optimizer.
""")

emit("shardopt_gather_state", "gather_state_{rank}", GATHER_STATE, ("r4",), RANKS, doc="""\
  !> Collective: state `name` ("master", "exp_avg", "exp_avg_sq",
  !> "momentum_buffer", ...) of parameter i (from 1), gathered from the
  !> shards into out (a real(4) array of the parameter's size).
""")
