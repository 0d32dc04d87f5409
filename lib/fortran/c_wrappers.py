"""The module's procedures that only call their C function.

Many of the module's procedures (shardopt_comm_rank, shardopt_step,
shardopt_set_lr, ...) take the C function's parameters under the same
names, in Fortran types, and call it: each is a row of WRAPPERS, written
out from the C prototype (c_api.py). What the prototype says becomes:

- a handle (shardopt_comm_t): type(shardopt_comm), passed as its ptr
  (intent(inout) where the C function takes its address: destroy);
- int, double, const char*: integer, real(c_double), character(len=*),
  intent(in); size_t: an index (a stage-3 unit), an integer from 1 as
  Fortran numbers, passed less 1; a flag (the row's flags) an optional logical, its default
  when absent; `group` an optional group number from 1 (the row's group:
  whether absent means every group, or group 1);
- a pointer to int, size_t, int64_t, double or a struct: intent(out),
  given a value before the call (the row's init, "empty" for a struct of
  zeros; else 0, and a struct none), defined when the call fails with ierr.

Optional arguments (flags, group, the row's optional outputs) go after
the others, ierr last. A row may rename a parameter, and ask for
speak_fortran first (procedures a program may call before any other).
"""

import textwrap

# name, doc; then: rename {C name: Fortran name}, init {name: value},
# optional (outputs), flags {name: default}, group (True: absent is every
# group), speak.
WRAPPERS = [
    ("shardopt_version", "The library's version at run time, by part.", {}),
    ("shardopt_device_count", "The CUDA devices this process sees (0 without CUDA).", dict(speak=True)),
    ("shardopt_set_device", "Makes CUDA device `device` (numbered from 0, as CUDA does) current.",
     dict(speak=True)),
    ("shardopt_comm_destroy", "Collective: frees the communicator (its optimizers first).", {}),
    ("shardopt_comm_rank", "This process's rank (from 0).", dict(init={"rank": "-1"})),
    ("shardopt_comm_size", "The number of ranks.", {}),
    ("shardopt_comm_node", "Which ranks share a node (MPI_COMM_TYPE_SHARED), found when comm was made: "
     "this rank's node (from 0, numbered by their lowest rank), the number of nodes, this rank's place "
     "among its node's ranks (from 0) and how many ranks its node holds.",
     dict(init={"node": "-1", "local_rank": "-1"})),
    ("shardopt_barrier", "Collective: waits for every rank.", {}),
    ("shardopt_zero_options_init", "The default options (stage 1, ...), to change before "
     "shardopt_optimizer_create(..., options=...).", {}),
    ("shardopt_optimizer_destroy", "Frees the optimizer (waits for communication in flight); opt%ptr "
     "becomes null, so a later use of opt is reported, never a crash.", {}),
    ("shardopt_zero_grad", "Local: zeroes the gradients and forgets what was marked ready.", {}),
    ("shardopt_reduce_gradients", "Collective: ends a micro-batch (stage 2 reduces into its gradient "
     "shard).", {}),
    ("shardopt_num_units", "Local: the number of stage-3 units (docs/zero.md, \"Stage 3\"), numbered from 1 "
     "in the order their parameters were added.", dict(rename={"count": "n"})),
    ("shardopt_gather_unit", "Collective: gathers unit `unit`'s parameters (stage 3) into the optimizer's "
     "pool; shardopt_param_data then points at them. Every rank names the same unit, or every rank gets the "
     "error naming each rank's.", {}),
    ("shardopt_igather_unit", "Collective: as shardopt_gather_unit, returning once the gathers are issued; "
     "shardopt_param_data or shardopt_release_unit waits for them.", {}),
    ("shardopt_release_unit", "Collective: unit `unit`'s gathered parameters are no longer used (stage 3).",
     {}),
    ("shardopt_clip_grad_norm", "Collective: the global gradient norm (into norm, if given); the next "
     "step clips the gradients to max_norm.", dict(optional={"norm"})),
    ("shardopt_step", "Collective: one optimizer step; info (if given) says what it did.",
     dict(optional={"info"})),
    ("shardopt_loss_scale", "Local: the loss scale to multiply the loss by (1 without a loss scaler).", {}),
    ("shardopt_steps", "Local: steps applied so far, and (if given) steps skipped for non-finite "
     "gradients.", dict(optional={"skipped"})),
    ("shardopt_num_params", "Local: the number of parameters.", dict(rename={"count": "n"})),
    ("shardopt_set_lr", "Local: the learning rate of group `group` (from 1), or of every group when "
     "group is absent; between steps, the same on every rank.", dict(group=True)),
    ("shardopt_set_hparams", "Local: hyper-parameters from \"name=value ...\" pairs (\"lr=1e-4 "
     "weight_decay=0\") of group `group` (from 1; absent: every group). On an error nothing changes.",
     dict(group=True)),
    ("shardopt_get_hparam", "Local: hyper-parameter `name` (\"lr\", \"betas.1\", ...) of group `group` "
     "(from 1; default 1).", dict(group=False)),
    ("shardopt_memory_report", "Local: bytes allocated by category.", dict(init={"report": "empty"})),
    ("shardopt_load", "Collective: restores a checkpoint, at any rank count and stage. strict (default "
     ".true.): any difference is an error and nothing changes; hyper_parameters (default .true.): take "
     "the groups' values from the file. report (if given) says what was loaded.",
     dict(flags={"strict": 1, "hyper_parameters": 1}, optional={"report"}, init={"report": "empty"})),
    ("shardopt_export", "Collective: the parameters alone as a safetensors file: fp32 master values "
     "(fp32 = .true., the default) or the model's dtype.", dict(flags={"fp32": 1})),
]

# Pointed-to types of outputs: the Fortran argument's type, and whether
# the C value goes through a local of its own kind first.
OUTPUTS = {
    "int*": ("integer", "integer(c_int)"),
    "size_t*": ("integer", "integer(c_size_t)"),
    "int64_t*": ("integer(c_int64_t)", None),
    "double*": ("real(c_double)", None),
}


def line(text, indent):
    lines = textwrap.wrap(text, 108 - len(indent), break_long_words=False, break_on_hyphens=False)
    return indent + (" &\n" + indent + "    ").join(lines) + "\n"


def wrapper(api, name, doc, row):
    prototypes = {n: params for n, _, params in api.functions}
    if name not in prototypes:
        raise SystemExit("c_wrappers.py: WRAPPERS names %s, which the headers do not declare" % name)
    rename, init = row.get("rename", {}), row.get("init", {})
    optional, flags = row.get("optional", set()), row.get("flags", {})
    args, late, decls, locals_, before, passed, after = [], [], [], [], [], [], []
    if row.get("speak"):
        before.append("call speak_fortran()")
    for ctype, param in prototypes[name]:
        arg = rename.get(param, param)
        base = ctype.replace("const ", "").rstrip("*")
        opt = ", optional" if arg in optional else ""
        (late if opt or arg in flags or arg == "group" else args).append(arg)
        if base in api.handles:
            decls.append("type(%s), intent(%s) :: %s" % (base[:-2], "inout" if ctype.endswith("*") else "in", arg))
            passed.append(arg + "%ptr")
        elif arg in flags:
            decls.append("logical, intent(in), optional :: " + arg)
            locals_.append("integer(c_int) :: %s_c" % arg)
            before.append("%s_c = %d" % (arg, flags[arg]))
            before.append("if (present(%s)) %s_c = logical_int(%s)" % (arg, arg, arg))
            passed.append(arg + "_c")
        elif arg == "group" and ctype == "int":
            decls.append("integer, intent(in), optional :: group")
            locals_.append("integer(c_int) :: group_c")
            after_inits = "if (.not. group_index(opt, group, .%s., '%s', group_c, ierr)) return" % (
                str(row["group"]).lower(), name)
            passed.append("group_c")
        elif ctype == "size_t":
            decls.append("integer, intent(in) :: " + arg)
            passed.append("int(%s - 1, c_size_t)" % arg)
        elif ctype in ("int", "double"):
            decls.append("%s, intent(in) :: %s" % ("integer" if ctype == "int" else "real(c_double)", arg))
            passed.append("int(%s, c_int)" % arg if ctype == "int" else arg)
        elif ctype == "const char*":
            decls.append("character(len=*), intent(in) :: " + arg)
            passed.append("trim(%s)//c_null_char" % arg)
        elif ctype in OUTPUTS or (ctype.endswith("*") and base in api.structs):
            ftype, ckind = OUTPUTS.get(ctype, ("type(%s)" % base, None))
            value = init.get(arg, "0")
            if base in api.structs and arg in init:
                value = "%s(%s)" % (base, ", ".join("c_null_ptr" if t.endswith("*") else "0"
                                                    for t, names in api.structs[base] for _ in names.split(",")))
            elif base in api.structs:
                value = None
            decls.append("%s, intent(out)%s :: %s" % (ftype, opt, arg))
            target = arg
            if ckind or opt:
                target = arg + "_c"
                locals_.append("%s :: %s" % (ckind or ftype, target))
                copy = "int(%s)" % target if ckind else target
                after.append(("if (present(%s)) " % arg if opt else "") + "%s = %s" % (arg, copy))
            if value:
                before.append("%s = %s" % (target, value))
            passed.append(target)
        else:
            raise SystemExit("c_wrappers.py: %s: parameter %s (%s) has no Fortran form here: write the "
                             "procedure in shardopt.f90 instead" % (name, param, ctype))
    if "group_c" in passed:
        before.append(after_inits)
    text = textwrap.fill(doc, 80, initial_indent="  !> ", subsequent_indent="  !> ") + "\n"
    text += line("subroutine %s(%s)" % (name, ", ".join(args + late + ["ierr"])), "  ")
    body = decls + ["integer, intent(out), optional :: ierr"] + locals_ + before
    body.append("call done(c_%s(%s), ierr)" % (name.replace("shardopt_", "", 1), ", ".join(passed)))
    text += "".join(line(text, "    ") for text in body + after)
    return text + "  end subroutine\n"


def module_code(api):
    return "\n".join(wrapper(api, name, doc, row) for name, doc, row in WRAPPERS)
