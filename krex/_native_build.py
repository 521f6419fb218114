"""cffi builder of krex._native (API mode, out of line), run by setup.py's cffi_modules.

The cdef is generated from shim/krex_layout.h and shim/krex_control.h, so the layout has one
definition: comments and preprocessor lines are dropped except the object-like integer
`#define KREX_*` constants, kept with their literal value (cffi needs KREX_MAX_GPUS as an array
length, and in API mode checks every such value against the compiler's when the module loads).
The structs keep their full field lists, so cffi checks their layout against the header too.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

SHIM = Path(__file__).resolve().parent.parent / "shim"
HEADERS = ("krex_layout.h", "krex_control.h")

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
# An object-like macro with a value (a function-like one has "(" right after its name).
_DEFINE = re.compile(r"#\s*define\s+(KREX_\w+)\s+(.+)")
_INT_LITERAL = re.compile(r"\(?(-?(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*)\)?")


def cdef_from_header(text: str) -> str:
    """The declarations of a C header as cffi cdef text."""
    text = _COMMENT.sub(" ", text).replace("\\\n", " ")
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            define = _DEFINE.fullmatch(stripped)
            if define:  # an integer literal stays (cffi checks it); anything else: ask the compiler
                literal = _INT_LITERAL.fullmatch(define.group(2).strip())
                lines.append(f"#define {define.group(1)} {literal.group(1) if literal else '...'}")
        elif stripped:
            lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


CDEF = "".join(cdef_from_header((SHIM / name).read_text()) for name in HEADERS)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "krex._native",
    '#include "krex_control.h"',
    sources=["shim/control.c", "shim/layout.c", "shim/proc.c"],
    include_dirs=["shim"],
    depends=[f"shim/{name}" for name in HEADERS],
    extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Werror"],
    libraries=["rt"],
)

if __name__ == "__main__":  # python krex/_native_build.py: print the generated cdef
    print(CDEF, end="")
