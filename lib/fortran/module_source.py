#!/usr/bin/env python3
"""Writes the source of shardopt's Fortran module.

    module_source.py shardopt.f90 OUT HEADER...

copies shardopt.f90 to OUT with its include lines replaced by what is
generated: c_api.inc by the C API's constants, types and interfaces (from
the headers, c_api.py), c_wrappers.inc by the procedures that only call
their C function (c_wrappers.py), kind_interfaces.inc and
kind_wrappers.inc by the specifics of the generics over array kinds and
their interfaces (kind_wrappers.py); any other include line by the file
it names beside shardopt.f90 (errors.inc). Everything goes into the
source rather than beside it because Meson tracks no Fortran include
files: a changed header, template or included file would not recompile
the module.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c_api  # noqa: E402
import c_wrappers  # noqa: E402
import kind_wrappers  # noqa: E402


def main(source, output, headers):
    api, api_code = c_api.module_code(headers)
    pieces = {"c_api.inc": api_code,
              "c_wrappers.inc": c_wrappers.module_code(api),
              "kind_interfaces.inc": kind_wrappers.interfaces().rstrip() + "\n",
              "kind_wrappers.inc": "".join(kind_wrappers.procedures).rstrip() + "\n"}
    text = "! Written by module_source.py from lib/fortran/shardopt.f90 and the C headers: edit those.\n"
    with open(source, encoding="utf-8") as f:
        for line in f:
            include = re.fullmatch(r"\s*include '(\w+\.inc)'\s*", line)
            if include and include.group(1) in pieces:
                text += "  ! " + include.group(1) + ":\n" + pieces.pop(include.group(1))
            elif include:
                with open(os.path.join(os.path.dirname(source), include.group(1)), encoding="utf-8") as part:
                    text += part.read()
            else:
                text += line
    if pieces:
        sys.exit("module_source.py: %s has no line include '%s'" % (source, "', '".join(pieces)))
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: module_source.py SOURCE OUTPUT HEADER...")
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
