"""The C API as Fortran: shardopt's named constants, bind(c) types and C
function interfaces, read from its headers (include/shardopt/shardopt.h and
status.h), which stay their only source.

The headers' enumerators become named constants, their structs bind(c)
types of the same name and fields, and every SHARDOPT_API function an
interface c_<name without shardopt_> (shardopt_step: c_step). A type is
mapped by the tables below, never guessed: a function with a parameter,
result or field they do not map stops the build, naming it, unless SKIP
says why Fortran goes without it.
"""

import re
import textwrap

# The C scalar types the API uses (typedefs of int resolved), as Fortran
# kinds. Fortran has no unsigned integers: uint64_t counters are read as
# int64_t, which holds any byte count a run reaches.
SCALARS = {
    "int": "integer(c_int)",
    "MPI_Fint": "integer(c_int)",
    "size_t": "integer(c_size_t)",
    "int64_t": "integer(c_int64_t)",
    "uint64_t": "integer(c_int64_t)",
    "double": "real(c_double)",
}

# Parameter types other than scalars passed by value, as dummy arguments:
# (attributes, array spec). HANDLE is any opaque handle (shardopt_comm_t,
# ...), STRUCT any struct of the headers. A pointer to a scalar is an
# output; buffers and arrays of pointers are addresses the module takes
# with c_loc, and char* buffers may be NULL.
POINTERS = {
    "int*": ("integer(c_int), intent(out)", ""),
    "MPI_Fint*": ("integer(c_int), intent(out)", ""),
    "size_t*": ("integer(c_size_t), intent(out)", ""),
    "int64_t*": ("integer(c_int64_t), intent(out)", ""),
    "double*": ("real(c_double), intent(out)", ""),
    "const char*": ("character(kind=c_char), intent(in)", "(*)"),
    "char*": ("type(c_ptr), value", ""),
    "void*": ("type(c_ptr), value", ""),
    "const void*": ("type(c_ptr), value", ""),
    "float*": ("type(c_ptr), value", ""),
    "float* const*": ("type(c_ptr), value", ""),
    "const char* const*": ("type(c_ptr), value", ""),
    "void**": ("type(c_ptr), intent(out)", ""),
    "const char**": ("type(c_ptr), intent(out)", ""),
    "const void**": ("type(c_ptr), intent(out)", ""),
    "HANDLE": ("type(c_ptr), value", ""),
    # Create, destroy, wait: the call reads or sets the handle.
    "HANDLE*": ("type(c_ptr), intent(inout)", ""),
    "STRUCT*": ("type({struct}), intent(out)", ""),
    "const STRUCT*": ("type({struct}), intent(in)", ""),
}

# Parameters the rules above would map otherwise ("function parameter").
OVERRIDES = {
    # An array of num_params structs, NULL when there are none.
    "shardopt_optimizer_create params": ("type(c_ptr), value", ""),
}

# Functions Fortran has no interface for, and why.
SKIP = {
    "shardopt_comm_create": "takes C's MPI_Comm: the module calls shardopt_comm_create_f",
    "shardopt_comm_mpi": "gives C's MPI_Comm: the module calls shardopt_comm_mpi_f",
}

# Types and constants the module keeps to itself: it takes their fields
# as keyword arguments, and says its language itself. A private type is
# named without shardopt_ (comm_options_t): gfortran still writes its name
# into the module file and the library's symbols, as it always was.
PRIVATE = {"shardopt_comm_options_t", "shardopt_step_options_t", "SHARDOPT_LANGUAGE_C",
           "SHARDOPT_LANGUAGE_FORTRAN"}


def fortran_type(name):
    return name.replace("shardopt_", "", 1) if name in PRIVATE else name


class Api:
    """What the headers declare: constants, structs and functions, in their order."""

    def __init__(self, headers):
        text = ""
        for path in headers:
            with open(path, encoding="utf-8") as f:
                text += f.read() + "\n"
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
        text = re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)
        self.ints = set(re.findall(r"typedef\s+int\s+(\w+)\s*;", text))
        self.ints |= set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text))
        self.handles = set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text))
        self.constants = []  # (name, value)
        for body in re.findall(r"\benum\s+\w*\s*\{([^}]*)\}", text):
            for item in filter(str.strip, body.split(",")):
                name, value = (part.strip() for part in item.split("="))
                self.constants.append((name, int(value)))
        self.structs = {}  # name: [(C type, field names)]
        for body, name in re.findall(r"typedef\s+struct\s+\w+\s*\{([^}]*)\}\s*(\w+)\s*;", text):
            self.structs[name] = [self.declaration(d) for d in body.split(";") if d.strip()]
        self.functions = []  # (name, C result type, [(C type, parameter)])
        declared = len(re.findall(r"\bSHARDOPT_API\b", text))
        for result, name, params in re.findall(r"\bSHARDOPT_API\s+([^;(]*?)\s*(\w+)\s*\(([^)]*)\)\s*;", text):
            params = [] if params.strip() == "void" else [self.declaration(p) for p in params.split(",")]
            self.functions.append((name, self.resolve(result), params))
        if declared != len(self.functions):
            raise SystemExit("c_api.py: %d SHARDOPT_API declarations, %d read as prototypes: write each as "
                             "SHARDOPT_API <type> <name>(<parameters>);" % (declared, len(self.functions)))

    def declaration(self, text):
        """'const char* const* keys' as ('const char* const*', 'keys'); a
        field list ('double a, b') as (type, 'a, b')."""
        match = re.fullmatch(r"\s*(.*?[\s*])\s*(\w+(?:\s*,\s*\w+)*)\s*", text, flags=re.S)
        if not match:
            raise SystemExit("c_api.py: cannot read the declaration '%s'" % " ".join(text.split()))
        return self.resolve(match.group(1)), ", ".join(re.split(r"\s*,\s*", match.group(2)))

    def resolve(self, ctype):
        """The type with spaces normalised and int typedefs as int."""
        ctype = re.sub(r"\s*\*", "*", " ".join(ctype.split()))
        ctype = re.sub(r"\*(?=\w)", "* ", ctype)
        return re.sub(r"\w+", lambda word: "int" if word.group(0) in self.ints else word.group(0), ctype)

    def fortran(self, ctype, where):
        """A parameter's (attributes, array spec)."""
        if ctype in SCALARS:
            return SCALARS[ctype] + ", value", ""
        base = ctype.replace("const ", "").rstrip("*")
        generic = ctype
        if base in self.handles:
            generic = ctype.replace(base, "HANDLE")
        elif base in self.structs:
            generic = ctype.replace(base, "STRUCT")
        if generic not in POINTERS:
            raise SystemExit("c_api.py: %s is of type %s, which the tables of lib/fortran/c_api.py do not "
                             "map to Fortran: add it there (or the function to SKIP)" % (where, ctype))
        attributes, dims = POINTERS[generic]
        return attributes.format(struct=fortran_type(base)), dims

    def field(self, ctype, where):
        if ctype.endswith("*"):
            return "type(c_ptr)"
        if ctype not in SCALARS:
            raise SystemExit("c_api.py: %s is of type %s, not in SCALARS of lib/fortran/c_api.py" % (where, ctype))
        return SCALARS[ctype]


def public(name):
    return "" if name in PRIVATE else ", public"


def wrap(text, indent):
    lines = textwrap.wrap(text, 108 - len(indent), break_long_words=False, break_on_hyphens=False)
    return (" &\n" + indent + "    ").join(lines)


def interface(api, name, result, params):
    where = "%s(%s)" % (name, ", ".join(p for _, p in params))
    dummies = []  # (declaration, [names])
    for ctype, param in params:
        key = "%s %s" % (name, param)
        attributes, dims = OVERRIDES[key] if key in OVERRIDES else api.fortran(ctype, "%s: %s" % (where, param))
        if dummies and dummies[-1][0] == attributes:
            dummies[-1][1].append(param + dims)
        else:
            dummies.append((attributes, [param + dims]))
    if result == "void":
        kind, first, last = "subroutine", "subroutine", ""
    elif result == "const char*":
        kind, first, last = "function", "type(c_ptr)", " result(r)"
    elif result in SCALARS:
        kind, first, last = "function", SCALARS[result], " result(r)"
    else:
        raise SystemExit("c_api.py: %s returns %s, which lib/fortran/c_api.py does not map" % (name, result))
    text = "    " + wrap("%s c_%s(%s) bind(c, name='%s')%s" % (
        kind, name.replace("shardopt_", "", 1), ", ".join(p for _, p in params), name, last), "    ") + "\n"
    if params or kind == "function":
        text += "      import\n"
    for attributes, names in dummies:
        text += "      %s :: %s\n" % (attributes, ", ".join(names))
    if kind == "function":
        text += "      %s :: r\n" % first
    return text + "    end %s\n" % kind


def module_code(headers):
    """The declarations of the module's c_api.inc: constants, types, interfaces."""
    api = Api(headers)
    unknown = sorted(set(SKIP) - {name for name, _, _ in api.functions})
    if unknown:
        raise SystemExit("c_api.py: SKIP names %s, which the headers do not declare" % ", ".join(unknown))
    text = "  ! The headers' enumerators.\n"
    for name, value in api.constants:
        text += "  integer, parameter%s :: %s = %d\n" % (public(name), name, value)
    text += "\n  ! The headers' structs, field for field (shardopt.h documents each field).\n"
    for name, fields in api.structs.items():
        text += "  type, bind(c)%s :: %s\n" % (public(name), fortran_type(name))
        for ctype, names in fields:
            text += "    %s :: %s\n" % (api.field(ctype, "%s%%%s" % (name, names)), names)
        text += "  end type\n\n"
    text += "  ! The C functions.\n  interface\n"
    for name, result, params in api.functions:
        if name not in SKIP:
            text += interface(api, name, result, params)
    return api, text + "  end interface\n"
