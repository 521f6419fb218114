"""The probe catalogue of tests/test_warm_native.py (issue #48): each a few lines of Python
printing one JSON value, what the program observes or what happened to it, with the caller it
runs under and the view of its run that is compared (tests/warm_native.py runs it natively,
cold and warm).

A view keeps what a program could depend on and drops what differs between any two runs
(pids, addresses, timings); paths of the run are written <dir> (the probe's directory, its
cwd) and <python> (the interpreter).
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import time
from typing import Any

from warm_native import (
    PYTHON,
    Caller,
    Outcome,
    Probe,
    filter_env,
    kill_all,
    krex_library_dirs,
    wait_for_file,
    wait_gone,
)

GIB = 1 << 30
MIB = 1 << 20


def lowered(which: int, soft: int, hard: int) -> tuple[int, int]:
    """A limit at most the current hard one (a caller that is not root cannot raise it)."""
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
    return min(soft, hard), hard


# A UTF-8 locale whose streams use surrogateescape natively (CPython does for C.UTF-8).
UTF8 = {"LC_ALL": "C.UTF-8"}


# Views.
def status_only(o: Outcome) -> Any:
    return {"status": o.status}


def status_out_err(o: Outcome) -> Any:
    """The exit status and everything printed (paths and addresses normalised)."""
    return {"status": o.status, "out": o.norm(o.out), "err": o.err_lines()}


def status_value_err(o: Outcome) -> Any:
    return {"status": o.status, "value": o.value, "err": o.err_lines()}


def value_only(o: Outcome) -> Any:
    return o.value


def normed_value(o: Outcome) -> Any:
    """The printed value with the run's paths normalised."""
    return json.loads(o.norm(json.dumps(o.value)))


def traceback_view(o: Outcome) -> Any:
    """The exit status and the traceback as printed: its frames (file and line), the source
    lines shown and the exception's line."""
    return {"status": o.status, "out": o.norm(o.out), "err": o.err_lines()}


def env_view(o: Outcome) -> Any:
    """os.environ as the probe printed it, without krex's own variables (KREX_*, the shim's
    LD_PRELOAD entry, the simulated driver's LD_LIBRARY_PATH entry, CUDA_VISIBLE_DEVICES ...:
    warm_native.KREX_VARIABLES)."""
    v = o.value
    if not isinstance(v, dict):
        return {"status": o.status, "value": v}
    return {"status": o.status, "env": filter_env(v, krex_library_dirs())}


def modules_view(o: Outcome) -> Any:
    """Which of the listed modules the program sees imported, less the warm workers' preload
    modules (imported in a warm command by design, docs/pool.md)."""
    v = o.value
    if not isinstance(v, dict):
        return {"status": o.status, "value": v}

    def preloaded(m: str) -> bool:
        return any(m == p or m.startswith(p + ".") or p.startswith(m + ".") for p in o.preload)

    return {m: seen for m, seen in v.items() if not preloaded(m)}


def cpu_limit_view(o: Outcome) -> Any:
    """Killed for its CPU time (SIGXCPU at the soft limit, SIGKILL at the hard one) or not."""
    killed = o.status in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)
    return {"status": "killed for CPU time" if killed else o.status, "out": o.out}


def cgroup_view(o: Outcome) -> Any:
    """Whether the probe is in a krex tenant's group (its name differs per tenant)."""
    v = o.value
    if not isinstance(v, list):
        return v
    return sorted({re.sub(r"/krex-[^/]+/t\d+", "/<krex>/<tenant>", x) for x in v})


# Probe programs' shared lines.
EMIT = "import json, sys\ndef emit(v):\n    print(json.dumps(v, sort_keys=True), flush=True)\n"


def probe(
    name: str,
    doc: str,
    code: str,
    **kw: Any,
) -> Probe:
    return Probe(name=name, doc=doc, code=code, **kw)


CATALOGUE: list[Probe] = []


def add(*probes: Probe) -> None:
    CATALOGUE.extend(probes)


# Exit statuses, what reaches the output, tracebacks.
add(
    probe("exit_3", "sys.exit(3) gives 3", "import sys\nsys.exit(3)\n", view=status_out_err),
    probe(
        "exit_message",
        "sys.exit('bye') prints bye on stderr and gives 1",
        "import sys\nsys.exit('bye')\n",
        view=status_out_err,
    ),
    probe(
        "exit_true",
        "sys.exit(True) gives 1 and prints nothing (a bool is an int)",
        "import sys\nsys.exit(True)\n",
        view=status_out_err,
    ),
    probe(
        "exit_256",
        "sys.exit(256) gives 0 (the status's low byte)",
        "import sys\nsys.exit(256)\n",
        view=status_out_err,
    ),
    probe(
        "exit_list",
        "sys.exit([1, 2]) prints its argument and gives 1",
        "import sys\nsys.exit([1, 2])\n",
        view=status_out_err,
    ),
    probe("os_exit_7", "os._exit(7) gives 7", "import os\nos._exit(7)\n", view=status_out_err),
    probe(
        "uncaught_exception",
        "an uncaught exception: status 1, its traceback from the script's frame (the script "
        "run by a relative path, as `python bench.py`)",
        """
        def inner():
            raise ValueError("boom")


        inner()
        """,
        view=traceback_view,
    ),
    probe(
        "keyboard_interrupt",
        "raise KeyboardInterrupt: its traceback, then the process dies of SIGINT (130)",
        "print('before', flush=True)\nraise KeyboardInterrupt\n",
        view=traceback_view,
    ),
    probe(
        "sigterm_self",
        "killed by its own SIGTERM: 143",
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(10)\n",
        view=status_out_err,
    ),
    probe(
        "sigint_self",
        "its own SIGINT raises KeyboardInterrupt where it sleeps: the traceback, then 130",
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(10)\n",
        view=traceback_view,
    ),
    probe(
        "sigkill_self",
        "killed by its own SIGKILL: 137",
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(10)\n",
        view=status_out_err,
    ),
    probe(
        "segfault",
        "a segmentation fault: 139, nothing printed (no core: RLIMIT_CORE 0)",
        "import ctypes\nctypes.string_at(0)\n",
        caller=Caller(rlimits={resource.RLIMIT_CORE: (0, 0)}),
        view=status_out_err,
    ),
    probe(
        "alarm",
        "SIGALRM with no handler ends it: 142",
        "import signal, time\nsignal.alarm(1)\ntime.sleep(10)\n",
        view=status_out_err,
    ),
    probe(
        "unflushed_at_os_exit",
        "written to stdout and stderr without a flush, then os._exit: what reaches the output "
        "(stdout to a pipe is block-buffered, stderr line-buffered)",
        """
        import os, sys
        print("printed to stdout")
        sys.stdout.write("written to stdout")
        print("line to stderr", file=sys.stderr)
        sys.stderr.write("stderr without a newline")
        os._exit(0)
        """,
        view=status_out_err,
    ),
    probe(
        "unbuffered_env",
        "as unflushed_at_os_exit, with PYTHONUNBUFFERED=1: everything reaches the output",
        """
        import os, sys
        print("printed to stdout")
        sys.stdout.write("written to stdout")
        sys.stderr.write("stderr without a newline")
        os._exit(0)
        """,
        caller=Caller(env={"PYTHONUNBUFFERED": "1"}),
        view=status_out_err,
    ),
    probe(
        "unbuffered_flag",
        "as unflushed_at_os_exit, run as python -u",
        """
        import os, sys
        sys.stdout.write("written to stdout")
        sys.stderr.write("stderr without a newline")
        os._exit(0)
        """,
        argv=(PYTHON, "-u", "probe.py"),
        view=status_out_err,
    ),
    probe(
        "interleave",
        "stdout and stderr to one pipe (2>&1): the order the lines arrive in",
        """
        import sys
        print("out 1")
        print("err 1", file=sys.stderr)
        print("out 2")
        print("err 2", file=sys.stderr)
        """,
        caller=Caller(merge_stderr=True),
        view=status_out_err,
    ),
    probe(
        "stdout_devfull",
        "stdout is /dev/full: the flush at exit fails, a message on stderr and status 120",
        "print('x')\n",
        caller=Caller(stdout="devfull"),
        view=status_out_err,
    ),
    probe(
        "stdout_broken_pipe",
        "stdout is a pipe nobody reads (closed): BrokenPipeError at exit's flush, status 120",
        "print('x')\n",
        caller=Caller(stdout="broken"),
        view=status_out_err,
    ),
)

# Standard streams.
STDIO = (
    EMIT
    + """
import io
def describe(s):
    if s is None:
        return None
    d = {"isatty": s.isatty(), "encoding": s.encoding, "errors": s.errors,
         "line_buffering": s.line_buffering, "write_through": s.write_through,
         "name": s.name, "mode": getattr(s, "mode", None), "fileno": s.fileno(),
         "buffer": type(s.buffer).__name__,
         "raw": type(getattr(s.buffer, "raw", s.buffer)).__name__,
         "newlines": s.newlines}
    return d
emit({"stdin": describe(sys.stdin), "stdout": describe(sys.stdout),
      "stderr": describe(sys.stderr), "same": [sys.stdin is sys.__stdin__,
      sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__]})
"""
)
add(
    probe(
        "stdio_attrs",
        "sys.stdin/stdout/stderr: tty, encoding, errors, buffering, name, types",
        STDIO,
        caller=Caller(stdin=b"", env=UTF8),
    ),
    probe(
        "stdio_tty",
        "stdout a terminal (a pty): isatty and line buffering",
        STDIO,
        caller=Caller(stdout="pty", env=UTF8),
    ),
    probe(
        "stdout_surrogates",
        "an undecodable byte (a surrogate escape) written to stdout: natively written back as "
        "the byte (errors=surrogateescape in a UTF-8 locale)",
        'import sys\nsys.stdout.write("\\udcff-written\\n")\n',
        caller=Caller(env=UTF8),
        view=status_out_err,
    ),
    probe(
        "stdin_read",
        "piped stdin: input() then sys.stdin.read()",
        EMIT + "first = input()\nemit([first, sys.stdin.read()])\n",
        caller=Caller(stdin=b"hello\nworld\n"),
    ),
    probe(
        "stdin_closed",
        "started with fd 0 closed: sys.stdin is None, fd 0 is not open",
        """
        import json, os, sys
        try:
            os.fstat(0)
            fd0 = True
        except OSError:
            fd0 = False
        print(json.dumps({"stdin_none": sys.stdin is None, "fd0_open": fd0}))
        """,
        caller=Caller(close_stdin=True),
    ),
)

# Locale, time zone, temporary directory: read by the interpreter or a module at start or import.
add(
    probe(
        "locale_c",
        "LC_ALL=C: UTF-8 mode, the streams' encoding, the preferred encoding, the locale",
        EMIT
        + """
import locale
emit({"utf8_mode": sys.flags.utf8_mode, "stdout": sys.stdout.encoding,
      "filesystem": sys.getfilesystemencoding(),
      "preferred": locale.getpreferredencoding(False), "locale": locale.getlocale(),
      "LC_CTYPE": __import__("os").environ.get("LC_CTYPE")})
""",
        caller=Caller(env={"LC_ALL": "C"}),
        expect_pool="cold",  # the locale is read at the interpreter's start: krex runs it cold
    ),
    probe(
        "timezone",
        "TZ=Asia/Tokyo: time.tzname, time.timezone and the local hour of the epoch",
        EMIT
        + """
import time
emit({"tzname": time.tzname, "timezone": time.timezone,
      "hour": time.localtime(0).tm_hour})
""",
        caller=Caller(env={"TZ": "Asia/Tokyo"}),
    ),
    probe(
        "tmpdir",
        "TMPDIR set by the caller: tempfile.gettempdir()",
        EMIT + "import tempfile\nemit(tempfile.gettempdir())\n",
        files={"tmp/.keep": ""},
        caller=Caller(env={"TMPDIR": "{dir}/tmp"}),
        view=normed_value,
    ),
)

# __main__, argv, sys.path, the interpreter.
add(
    probe(
        "main_attrs",
        "__main__'s attributes: __file__, __spec__, __package__, __loader__, __cached__, "
        "__doc__, its globals",
        '''
        """The probe's docstring."""
        import json, sys
        import __main__
        print(json.dumps({
            "name": __name__, "file": __file__, "spec": repr(__spec__),
            "package": __package__, "loader": type(__loader__).__name__,
            "cached": __cached__, "doc": __doc__, "globals": sorted(globals()),
            "main_is_me": __main__.__dict__ is globals(),
            "annotations": "__annotations__" in globals(),
        }))
        ''',
        view=normed_value,
    ),
    probe(
        "builtins_module",
        "__builtins__ in __main__ is the builtins module",
        """
        import builtins, json
        print(json.dumps({"type": type(__builtins__).__name__,
                          "is_module": __builtins__ is builtins}))
        """,
    ),
    probe(
        "argv",
        "sys.argv with spaces, non-ASCII and option-like arguments",
        EMIT + "emit(sys.argv)\n",
        argv=(PYTHON, "probe.py", "a b", "ünï", "--flag", "-c", "-m", ""),
    ),
    probe(
        "orig_argv",
        "sys.orig_argv: the interpreter's own command line",
        EMIT + "emit(sys.orig_argv)\n",
        argv=(PYTHON, "probe.py", "x"),
        view=normed_value,
    ),
    probe(
        "sys_path",
        "sys.path in order, with PYTHONPATH of two entries",
        EMIT + "emit(sys.path)\n",
        files={"extra1/.keep": "", "extra2/.keep": ""},
        caller=Caller(env={"PYTHONPATH": "{dir}/extra1:{dir}/extra2"}),
        view=normed_value,
    ),
    probe(
        "pythonpath_relative",
        "a relative PYTHONPATH entry: sys.path as the interpreter makes it, a module from it",
        EMIT + "import mod_rel\nemit([sys.path[:3], mod_rel.__file__])\n",
        files={"extra1/mod_rel.py": ""},
        caller=Caller(env={"PYTHONPATH": "extra1"}),
        view=normed_value,
    ),
    probe(
        "executable",
        "sys.executable, sys._base_executable and the prefixes",
        EMIT + "emit([sys.executable, sys._base_executable, sys.prefix, sys.base_prefix, "
        "sys.exec_prefix, sys.platlibdir])\n",
        view=normed_value,
    ),
    probe(
        "flags",
        "sys.flags and sys.dont_write_bytecode (the caller has no PYTHON* variables)",
        EMIT + "f = sys.flags\n"
        "emit({n: getattr(f, n) for n in dir(f) if not n.startswith(('_', 'n_')) "
        "and not callable(getattr(f, n))} | "
        "{'dont_write_bytecode_attr': sys.dont_write_bytecode})\n",
    ),
    probe(
        "flags_B",
        "as flags, run as python -B",
        EMIT + "emit([sys.flags.dont_write_bytecode, sys.dont_write_bytecode])\n",
        argv=(PYTHON, "-B", "probe.py"),
    ),
    probe(
        "module_run",
        "python -m pkg x: __name__, __spec__.name, __package__, sys.argv, sys.path[0], a "
        "relative import",
        "",
        files={
            "pkg/__init__.py": "",
            "pkg/helper.py": "VALUE = 'relative import'\n",
            "pkg/__main__.py": """
                import json, sys
                from .helper import VALUE
                print(json.dumps({"name": __name__, "spec": __spec__.name,
                                  "package": __package__, "argv": sys.argv,
                                  "path0": sys.path[0], "file": __file__, "value": VALUE}))
            """,
        },
        argv=(PYTHON, "-m", "pkg", "x"),
        view=normed_value,
    ),
    probe(
        "code_run",
        "python -c CODE a: sys.argv, sys.path[0], __name__, no __file__",
        "",
        argv=(
            PYTHON,
            "-c",
            "import json, sys; print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
            "'name': __name__, 'has_file': '__file__' in globals(), "
            "'spec': repr(__spec__)}))",
            "a",
        ),
        view=normed_value,
    ),
    probe(
        "directory_main",
        "python app (a directory with __main__.py): sys.path[0] is the directory itself",
        "",
        files={
            "app/__main__.py": """
                import json, sys
                print(json.dumps({"path0": sys.path[0], "file": __file__,
                                  "argv": sys.argv, "name": __name__}))
            """,
        },
        argv=(PYTHON, "app"),
        view=normed_value,
    ),
    probe(
        "json_shadow",
        "the project's own json.py beside the script: `import json` gets it, natively",
        """
        import os, sys
        import json
        where = os.path.relpath(os.path.dirname(os.path.abspath(json.__file__)))
        print('"' + where + '"' if len(where) < 20 else '"elsewhere: stdlib"')
        """,
        files={"json.py": "PROJECTS_OWN = True\n"},
        view=status_value_err,
        expect_pool="cold",  # a fresh interpreter in the warm child's place (docs/pool.md)
    ),
    probe(
        "modules_visible",
        "which of some modules a program sees imported at its start (less the preload modules)",
        """
        import sys
        names = ["asyncio", "krex", "ssl", "argparse", "subprocess", "ctypes", "socket",
                 "json", "dataclasses", "typing", "logging", "runpy", "select", "threading",
                 "random", "numpy", "torch", "triton", "psutil", "signal", "weakref"]
        seen = {n: n in sys.modules for n in names}
        import json
        print(json.dumps(seen, sort_keys=True))
        """,
        view=modules_view,
    ),
    probe(
        "modules_count",
        "len(sys.modules) at the start (recorded only: the warm workers' imports)",
        "import sys\nn = len(sys.modules)\nprint(n)\n",
    ),
    probe(
        "sitecustomize",
        "a sitecustomize module on the caller's PYTHONPATH runs before the program",
        EMIT + "import builtins\nemit(getattr(builtins, 'SITECUSTOMIZE_RAN', False))\n",
        files={"site/sitecustomize.py": "import builtins\nbuiltins.SITECUSTOMIZE_RAN = True\n"},
        caller=Caller(env={"PYTHONPATH": "{dir}/site"}),
        expect_pool="cold",  # natively it runs at start-up: a fresh interpreter does
    ),
    probe(
        "inspect_and_pickle",
        "a function of __main__: inspect.getsource, pickled and unpickled by reference",
        """
        import inspect, json, pickle


        def f(x):
            return x + 1


        print(json.dumps({"source": inspect.getsource(f).splitlines()[0],
                          "pickled": pickle.loads(pickle.dumps(f)) is f,
                          "module": f.__module__}))
        """,
    ),
    probe(
        "warnings",
        "warnings.filters' first entries, and a warning's line on stderr (its file)",
        """
        import json, warnings
        print(json.dumps([repr(f) for f in warnings.filters[:6]]))
        warnings.warn("from the probe")
        """,
        view=status_value_err,
    ),
    probe(
        "warnings_imported",
        "python -W always::UserWarning, then the modules a warm worker may preload imported "
        "(those installed): the filters' order (the option behind what the imports added, as "
        "natively) and a warning's line on stderr",
        """
        import importlib, json, warnings
        for m in ("numpy", "torch", "triton", "triton.testing"):
            try:
                importlib.import_module(m)
            except ImportError:
                pass
        print(json.dumps([repr(f) for f in warnings.filters[:12]]))
        warnings.warn("from the probe")
        """,
        argv=(PYTHON, "-W", "always::UserWarning", "probe.py"),
        view=status_value_err,
    ),
    probe(
        "warnings_W",
        "python -W error::UserWarning: a warning is raised, its traceback, status 1",
        "import warnings\nwarnings.warn('from the probe')\n",
        argv=(PYTHON, "-W", "error::UserWarning", "probe.py"),
        view=traceback_view,
    ),
    probe(
        "stack",
        "the frames below the script's (none natively) and the recursion depth it can reach",
        """
        import faulthandler, inspect, json, sys
        below = 0
        f = sys._getframe().f_back
        while f is not None:
            below += 1
            f = f.f_back


        def depth(n):
            try:
                return depth(n + 1)
            except RecursionError:
                return n


        print(json.dumps({"frames_below": below, "inspect_stack": len(inspect.stack()),
                          "max_depth": depth(0)}))
        """,
    ),
    probe(
        "faulthandler_dump",
        "faulthandler.dump_traceback(): the frames it shows",
        "import faulthandler\nfaulthandler.dump_traceback(all_threads=False)\n",
        view=status_out_err,
    ),
    probe(
        "hooks",
        "sys.excepthook and friends are the interpreter's own; no trace or profile function",
        """
        import json, sys, threading
        print(json.dumps({
            "excepthook": sys.excepthook is sys.__excepthook__,
            "displayhook": sys.displayhook is sys.__displayhook__,
            "breakpointhook": sys.breakpointhook is sys.__breakpointhook__,
            "unraisablehook": sys.unraisablehook is sys.__unraisablehook__,
            "threading_excepthook": threading.excepthook is threading.__excepthook__,
            "trace": sys.gettrace() is None, "profile": sys.getprofile() is None,
            "meta_path": [type(m).__name__ if not isinstance(m, type) else m.__name__
                          for m in sys.meta_path],
            "path_hooks": [getattr(h, "__name__", type(h).__name__) for h in sys.path_hooks],
        }))
        """,
    ),
    probe(
        "interpreter_settings",
        "recursion limit, switch interval, int digits, encodings, dlopen flags, gc, faulthandler",
        """
        import faulthandler, gc, json, sys
        print(json.dumps({
            "recursionlimit": sys.getrecursionlimit(),
            "switchinterval": sys.getswitchinterval(),
            "int_max_str_digits": sys.get_int_max_str_digits(),
            "defaultencoding": sys.getdefaultencoding(),
            "fs": [sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()],
            "dlopenflags": sys.getdlopenflags(),
            "gc": [gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()],
            "faulthandler": faulthandler.is_enabled(),
        }))
        """,
    ),
    probe(
        "faulthandler_env",
        "PYTHONFAULTHANDLER=1 (a start-up variable: krex runs it cold)",
        "import faulthandler, json\nprint(json.dumps(faulthandler.is_enabled()))\n",
        caller=Caller(env={"PYTHONFAULTHANDLER": "1"}),
        expect_pool="cold",
    ),
    probe(
        "hashseed_env",
        "PYTHONHASHSEED=7 (a start-up variable: krex runs it cold): hash('abc') as natively",
        "import json\nprint(json.dumps(hash('abc')))\n",
        caller=Caller(env={"PYTHONHASHSEED": "7"}),
        expect_pool="cold",
    ),
    probe(
        "optimize_flag",
        "python -O (not emulated: krex runs it cold): __debug__ False, asserts skipped",
        "import json\nassert False\nprint(json.dumps(__debug__))\n",
        argv=(PYTHON, "-O", "probe.py"),
        expect_pool="cold",
    ),
    probe(
        "random_seeded",
        "random.seed(1) then random.random() and a Random(5)'s: the same everywhere",
        EMIT
        + "import random\nrandom.seed(1)\nemit([random.random(), random.Random(5).random()])\n",
    ),
)


# The environment and the working directory.
ENV_DUMP = EMIT + "import os\nemit(dict(os.environ))\n"
add(
    probe(
        "environ",
        "os.environ exactly (less krex's own variables), with spaces, an empty value, "
        "non-ASCII, HOME unset",
        ENV_DUMP,
        caller=Caller(
            env={"PROBE_SPACES": "a b  c", "PROBE_EMPTY": "", "PROBE_UNICODE": "ünï", "HOME": None}
        ),
        view=env_view,
    ),
    probe(
        "environ_minimal",
        "an environment of two variables (env -i): os.environ and sys.path[0]",
        ENV_DUMP,
        caller=Caller(clear_env=True, env={"LANG": "C.UTF-8", "PROBE": "1"}),
        view=env_view,
    ),
    probe(
        "environ_bytes",
        "an undecodable byte in a variable's value reaches os.environb as it was",
        EMIT + "import os\nemit(os.environb[b'PROBE_BYTES'].hex())\n",
        caller=Caller(env={"PROBE_BYTES": os.fsdecode(b"\xff\xfeA")}),
    ),
    probe(
        "libc_environ",
        "the C library's environment (getenv, environ) is os.environ",
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None)
        arr = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
        keys, i = set(), 0
        while arr[i]:
            keys.add(arr[i].split(b"=", 1)[0].decode(errors="replace"))
            i += 1
        libc.getenv.restype = ctypes.c_char_p
        print(json.dumps({"only_libc": sorted(keys - set(os.environ)),
                          "only_os": sorted(set(os.environ) - keys),
                          "getenv": (libc.getenv(b"PROBE_VALUE") or b"").decode()}))
        """,
        caller=Caller(env={"PROBE_VALUE": "seen by C"}),
    ),
    probe(
        "proc_environ",
        "/proc/self/environ (the environment the process was exec'd with) against os.environ",
        """
        import json, os
        raw = open("/proc/self/environ", "rb").read().split(b"\\0")
        keys = {e.split(b"=", 1)[0].decode(errors="replace") for e in raw if e}
        print(json.dumps({"only_proc": sorted(k for k in keys - set(os.environ)),
                          "only_os": sorted(set(os.environ) - keys)}))
        """,
        caller=Caller(env={"PROBE_VALUE": "1"}),
    ),
    probe(
        "proc_cmdline",
        "/proc/self/cmdline and comm",
        """
        import json
        cmdline = open("/proc/self/cmdline", "rb").read().split(b"\\0")
        print(json.dumps({"cmdline": [a.decode() for a in cmdline if a],
                          "comm": open("/proc/self/comm").read().strip()}))
        """,
        view=normed_value,
    ),
    probe(
        "cwd",
        "os.getcwd() and $PWD",
        EMIT + "import os\nemit([os.getcwd(), os.environ.get('PWD')])\n",
        caller=Caller(env={"PWD": "{dir}"}),
        view=normed_value,
    ),
)

# Credentials, limits and scheduling of the caller.
add(
    probe(
        "ids",
        "uid, gid, their effective ones, the supplementary groups (the caller's, set to "
        "0 and 4242 where it is root)",
        EMIT + "import os\nemit([os.getuid(), os.geteuid(), os.getgid(), os.getegid(), "
        "sorted(os.getgroups())])\n",
        caller=Caller(groups=(0, 4242)),
    ),
    probe(
        "umask",
        "umask 077: a file the probe creates comes out 0600",
        """
        import json, os
        path = "made-by-probe"
        with open(path, "w"):
            pass
        mode = os.stat(path).st_mode & 0o777
        os.unlink(path)
        current = os.umask(0)
        print(json.dumps({"file": oct(mode), "umask": oct(current)}))
        """,
        caller=Caller(umask=0o077),
    ),
    probe(
        "nice_sched",
        "nice 5 and SCHED_BATCH: os.getpriority, the scheduling policy",
        EMIT + "import os\nemit({'priority': os.getpriority(os.PRIO_PROCESS, 0), "
        "'policy': os.sched_getscheduler(0)})\n",
        caller=Caller(nice=5, sched_batch=True),
    ),
    probe(
        "rlimit_nofile",
        "the caller's RLIMIT_NOFILE (512 soft)",
        EMIT + "import resource\nemit(resource.getrlimit(resource.RLIMIT_NOFILE))\n",
        caller=Caller(
            rlimits={
                resource.RLIMIT_NOFILE: (
                    512,
                    min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
                )
            }
        ),
    ),
    probe(
        "rlimits",
        "every resource limit as read back (the caller's AS, FSIZE, CORE and STACK set)",
        EMIT + "import resource\nemit({n: resource.getrlimit(getattr(resource, n)) "
        "for n in dir(resource) if n.startswith('RLIMIT_')})\n",
        caller=Caller(
            rlimits={
                resource.RLIMIT_AS: lowered(resource.RLIMIT_AS, 16 * GIB, 32 * GIB),
                resource.RLIMIT_FSIZE: lowered(resource.RLIMIT_FSIZE, GIB, 2 * GIB),
                resource.RLIMIT_CORE: lowered(resource.RLIMIT_CORE, 0, 4 * MIB),
                resource.RLIMIT_STACK: lowered(resource.RLIMIT_STACK, 16 * MIB, 32 * MIB),
            }
        ),
    ),
    probe(
        "rlimit_fsize_write",
        "RLIMIT_FSIZE 64 KiB: writing 128 KiB fails with EFBIG (SIGXFSZ is ignored)",
        """
        import json, os
        try:
            with open("big-file", "wb") as f:
                f.write(b"x" * (128 << 10))
            result = "written"
        except OSError as e:
            result = f"OSError errno {e.errno}"
        os.unlink("big-file")
        print(json.dumps(result))
        """,
        caller=Caller(rlimits={resource.RLIMIT_FSIZE: (64 << 10, 64 << 10)}),
    ),
    probe(
        "rlimit_cpu",
        "RLIMIT_CPU 2 s (ulimit -t 2): a 5 s CPU loop is killed at 2 s",
        """
        import time
        while time.process_time() < 5:
            pass
        print("done")
        """,
        caller=Caller(rlimits={resource.RLIMIT_CPU: (2, 2)}),
        view=cpu_limit_view,
        timeout_s=60,
    ),
    probe(
        "oom_score_adj",
        "the caller's oom_score_adj (500)",
        "print(open('/proc/self/oom_score_adj').read().strip())\n",
        caller=Caller(oom_score_adj=500),
    ),
    probe(
        "no_new_privs",
        "the caller's no_new_privs (prctl): NoNewPrivs in /proc/self/status",
        "print([l.split()[1] for l in open('/proc/self/status') "
        "if l.startswith('NoNewPrivs')][0])\n",
        caller=Caller(no_new_privs=True),
    ),
    probe(
        "affinity",
        "os.sched_getaffinity(0) (krex pins its commands to the GPU's cores)",
        EMIT + "import os\nemit(sorted(os.sched_getaffinity(0)))\n",
    ),
    probe(
        "cgroup",
        "/proc/self/cgroup (krex puts its commands in the tenant's group)",
        EMIT + "emit([l.split(':', 2)[2].strip() for l in open('/proc/self/cgroup') "
        "if 'freezer' in l or 'cpuset' in l or l.startswith('0:')])\n",
        view=cgroup_view,
    ),
    probe(
        "rusage",
        "resource.getrusage's ru_maxrss and the CPU time at the start (recorded only)",
        EMIT + "import resource, time\nemit({'maxrss_kib': resource.getrusage(resource.RUSAGE_SELF)"
        ".ru_maxrss, 'cpu_s': round(time.process_time(), 3)})\n",
    ),
)


# Process group, session, parent.
PGROUP = """
import json, os
me = os.getpid()
procs = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))


def argv(p):
    try:
        return [a.decode() for a in open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0") if a]
    except OSError:
        return []


def launcher(p):
    # krex run: our parent, running krex's `run`
    a = argv(p)
    return p == os.getppid() and "run" in a and any("krex" in x for x in a)


def mine(p):
    while p > 1 and p in procs:
        p = procs[p][0]
        if p == me:
            return True
    return False


def others(index, value):
    out = []
    for p, f in procs.items():
        if f[index] == value and p != me and not mine(p) and not launcher(p):
            out.append(" ".join(os.path.basename(x) for x in argv(p)[:3]))
    return sorted(out)


pgid, sid = os.getpgid(0), os.getsid(0)
print(json.dumps({"pgid_is_sid": pgid == sid,
                  "led_by_itself_or_krex_run": pgid == me or launcher(pgid),
                  "others_in_group": others(1, pgid), "others_in_session": others(2, sid),
                  "orphan": os.getppid() == 1}))
"""
add(
    probe(
        "process_group",
        "its process group and session: who else is in them besides itself, its children "
        "and `krex run`",
        PGROUP,
    ),
    probe(
        "killpg_own_group",
        "os.killpg(own group, SIGTERM): natively only the probe's group (its own session) "
        "dies, status 143; nobody else may be hit",
        """
        import os, signal, time
        os.killpg(os.getpgid(0), signal.SIGTERM)
        time.sleep(3)
        print("survived")
        """,
        view=status_out_err,
    ),
    probe(
        "kill_parent",
        "os.kill(os.getppid(), SIGTERM): cold, krex run forwards it to the command (143); "
        "natively under a stand-in parent that forwards signals as krex run does",
        """
        import os, signal, time
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(3)
        print("survived")
        """,
        native_parent=True,
        view=status_out_err,
    ),
)

# Signals: dispositions, mask, what the caller set, signals from the caller.
SIGNALS = (
    EMIT
    + """
import signal
def name(h):
    if h is signal.default_int_handler:
        return "default_int_handler"
    if isinstance(h, signal.Handlers):
        return h.name
    return repr(h)
status = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")
          if l.startswith(("SigBlk", "SigIgn"))}
emit({"handlers": {s.name: name(signal.getsignal(s)) for s in (
          signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGHUP,
          signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXFSZ, signal.SIGALRM)},
      "mask": sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
      "wakeup_fd": signal.set_wakeup_fd(-1), "proc": status})
"""
)
add(
    probe("signal_state", "signal handlers, the mask, the wakeup fd, SigIgn and SigBlk", SIGNALS),
    probe(
        "caller_ignores",
        "the caller ignores SIGHUP, SIGINT and SIGQUIT (nohup, `cmd &` in a script): ignored "
        "signals stay ignored across exec, and CPython leaves an ignored SIGINT ignored",
        SIGNALS,
        caller=Caller(ignore=(signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)),
    ),
    probe(
        "caller_blocks",
        "the caller blocks SIGUSR1 and SIGUSR2: the mask survives exec",
        SIGNALS,
        caller=Caller(block=(signal.SIGUSR1, signal.SIGUSR2)),
    ),
    probe(
        "sigterm_from_caller",
        "the caller sends SIGTERM (to krex run, natively to the probe): the probe's handler runs",
        """
        import os, signal, sys, time
        def handler(n, frame):
            # Straight to fd 1: the signal may come while print() still holds stdout's buffer
            # (the caller sends it once it has read "ready"), and print() there is reentrant.
            os.write(1, f"handled {signal.Signals(n).name}\n".encode())
            sys.exit(0)
        signal.signal(signal.SIGTERM, handler)
        print("ready", flush=True)
        time.sleep(20)
        print("not signalled")
        """,
        signal_when_ready=signal.SIGTERM,
        view=status_out_err,
    ),
    probe(
        "sigusr1_from_caller",
        "the caller sends SIGUSR1: the probe's handler runs, it goes on",
        """
        import signal, time
        got = []
        signal.signal(signal.SIGUSR1, lambda n, f: got.append(n))
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        print("handled" if got else "not signalled")
        """,
        signal_when_ready=signal.SIGUSR1,
        view=status_out_err,
    ),
    probe(
        "sigint_from_caller",
        "the caller sends SIGINT: KeyboardInterrupt where it sleeps, its traceback, 130",
        # "ready" once the main thread is on the sleep's line: a SIGINT sent as soon as the
        # caller reads it lands there in every mode (printed from the main thread, it landed
        # on the print now and then, natively: a race of the probe, not a difference).
        """
        import sys, threading, time
        def ready(line):
            main = threading.main_thread().ident
            while sys._current_frames()[main].f_lineno != line:
                time.sleep(0.001)
            print("ready", flush=True)
        threading.Thread(target=ready, args=(sys._getframe().f_lineno + 1,), daemon=True).start()
        time.sleep(20)
        """,
        signal_when_ready=signal.SIGINT,
        view=traceback_view,
    ),
    probe(
        "sigkill_from_caller",
        "the caller SIGKILLs (krex run, natively the probe): 137, and the probe is gone",
        """
        import os, time
        open("sigkill.pid", "w").write(str(os.getpid()))
        print("ready", flush=True)
        time.sleep(20)
        """,
        signal_when_ready=signal.SIGKILL,
        view=lambda o: {"status": o.status, "probe_gone": _probe_gone(o, "sigkill.pid")},
    ),
    probe(
        "sigpipe_write",
        "a write to a pipe with no reader: BrokenPipeError (SIGPIPE is ignored)",
        """
        import json, os
        r, w = os.pipe()
        os.close(r)
        try:
            os.write(w, b"x")
            result = "written"
        except OSError as e:
            result = type(e).__name__
        print(json.dumps(result))
        """,
    ),
)


def _probe_gone(o: Outcome, pidfile: str) -> bool:
    path = o.dir / pidfile
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return False
    path.unlink()
    left = wait_gone([pid], 5.0)
    kill_all(left)
    return not left


# Descriptors.
add(
    probe(
        "closerange",
        "os.closerange(3, 1024), then it runs on",
        """
        import os, time
        os.closerange(3, 1024)
        time.sleep(0.5)
        print("alive", flush=True)
        """,
        view=status_out_err,
    ),
    probe(
        "fds",
        "the open descriptors: 0, 1, 2 and the caller's pipe at fd 7, readable",
        """
        import json, os, select, stat
        fds = []
        for name in os.listdir("/proc/self/fd"):
            try:
                os.fstat(int(name))
            except OSError:
                continue  # the listing's own
            fds.append(int(name))
        def what(fd):
            try:
                st = os.fstat(fd)
            except OSError:
                return "closed"
            if stat.S_ISFIFO(st.st_mode):
                ready, _, _ = select.select([fd], [], [], 1.0)
                return "pipe: " + (os.read(fd, 100).decode() if ready else "nothing to read")
            return "socket" if stat.S_ISSOCK(st.st_mode) else "other"
        print(json.dumps({"fds": sorted(fds), "fd7": what(7)}))
        """,
        caller=Caller(pass_fd=7),
    ),
)

# Threads, exit handlers, the interpreter's exit.
add(
    probe(
        "threads",
        "threading.active_count(), the threads' names, the main thread",
        """
        import json, os, threading
        print(json.dumps({"count": threading.active_count(),
                          "names": [t.name for t in threading.enumerate()],
                          "main": threading.current_thread() is threading.main_thread(),
                          "native_id_is_pid": threading.get_native_id() == os.getpid()}))
        """,
    ),
    probe(
        "atexit_order",
        "atexit handlers run last registered first after the non-daemon threads, a failing "
        "one reported on stderr, one unregistered",
        """
        import atexit, sys, threading, time
        def handler(name):
            print("atexit", name, flush=True)
        def failing():
            raise RuntimeError("in an exit handler")
        def dropped():
            print("unregistered handler ran")
        atexit.register(handler, "first")
        atexit.register(failing)
        atexit.register(handler, "last")
        atexit.register(dropped)
        atexit.unregister(dropped)
        def late():
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        print("main done", flush=True)
        """,
        view=status_out_err,
    ),
    probe(
        "atexit_sys_exit",
        "an exit handler that calls sys.exit(5): the status stays the program's",
        """
        import atexit, sys
        atexit.register(lambda: sys.exit(5))
        print("main done")
        """,
        view=status_out_err,
    ),
    probe(
        "atexit_at_os_exit",
        "os._exit skips the exit handlers",
        """
        import atexit, os
        atexit.register(print, "atexit ran")
        os._exit(3)
        """,
        view=status_out_err,
    ),
    probe(
        "thread_exception",
        "an exception in a thread: threading.excepthook's report on stderr, status 0",
        """
        import threading
        def f():
            raise ValueError("in a thread")
        t = threading.Thread(target=f, name="worker")
        t.start()
        t.join()
        print("main done")
        """,
        view=status_out_err,
    ),
    probe(
        "daemon_thread",
        "a daemon thread still running at exit is dropped: its late line never appears",
        """
        import threading, time
        def late():
            time.sleep(0.5)
            print("daemon thread printed", flush=True)
        threading.Thread(target=late, daemon=True).start()
        print("main done")
        """,
        view=status_out_err,
    ),
    probe(
        "fork_child",
        "os.fork(): a child that sys.exit(3)s flushes its copy of the buffer; the parent waits",
        """
        import os, sys
        print("before fork")
        pid = os.fork()
        if pid == 0:
            print("child")
            sys.exit(3)
        _, status = os.waitpid(pid, 0)
        print("parent saw", os.waitstatus_to_exitcode(status))
        """,
        view=status_out_err,
    ),
    probe(
        "multiprocessing_fork",
        "multiprocessing's start method, Pool(2).map with a function of __main__, the "
        "process's names",
        """
        import json, multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            with mp.Pool(2) as pool:
                squares = pool.map(square, [1, 2, 3])
            print(json.dumps({"method": mp.get_start_method(), "squares": squares,
                              "name": mp.current_process().name,
                              "parent": mp.parent_process() is None}))
        """,
    ),
    probe(
        "multiprocessing_spawn",
        "Pool(2).map under the spawn method (the children import __main__ again)",
        """
        import json, multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            mp.set_start_method("spawn")
            with mp.Pool(2) as pool:
                print(json.dumps(pool.map(square, [1, 2, 3])))
        """,
    ),
    probe(
        "multiprocessing_forkserver",
        "Pool(2).map under the forkserver method",
        """
        import json, multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            mp.set_start_method("forkserver")
            with mp.Pool(2) as pool:
                print(json.dumps(pool.map(square, [1, 2, 3])))
        """,
    ),
    probe(
        "process_pool_executor",
        "concurrent.futures.ProcessPoolExecutor(2).map, then a clean exit",
        """
        import json
        from concurrent.futures import ProcessPoolExecutor
        def square(x):
            return x * x
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                print(json.dumps(list(ex.map(square, [1, 2, 3]))))
        """,
    ),
    probe(
        "subprocess_python",
        "a `python -c` subprocess of the probe: what it observes (flags, umask, limits, "
        "environment, argv, path)",
        """
        import json, subprocess, sys
        child = '''
        import json, os, resource, sys
        env = sorted(k for k in os.environ if not k.startswith(("KREX_", "LD_", "CUDA_")))
        um = os.umask(0)
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0],
                          "dont_write_bytecode": sys.flags.dont_write_bytecode,
                          "umask": oct(um), "env_keys": env,
                          "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                          "priority": os.getpriority(os.PRIO_PROCESS, 0)}))
        '''
        out = subprocess.run([sys.executable, "-c", child, "arg"], capture_output=True,
                             text=True, check=True).stdout
        print(out.strip())
        """,
        caller=Caller(umask=0o027, nice=3),
    ),
    probe(
        "asyncio_subprocess",
        "asyncio.run of a subprocess (the event loop's child watcher in a fresh process)",
        """
        import asyncio, json, sys
        async def main():
            p = await asyncio.create_subprocess_exec(sys.executable, "-c", "print('x')",
                                                     stdout=asyncio.subprocess.PIPE)
            out, _ = await p.communicate()
            return [p.returncode, out.decode()]
        print(json.dumps(asyncio.run(main())))
        """,
    ),
)


# Processes left behind.
LATE = """
import json, os, subprocess, sys
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
HELPER = '''
import os, subprocess, sys, time
time.sleep(float(sys.argv[1]))
g = subprocess.Popen(sys.argv[2:], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open("late.pid.tmp", "w") as f:
    f.write(str(g.pid))
os.rename("late.pid.tmp", "late.pid")
'''
quiet = dict(start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
             stderr=subprocess.DEVNULL)
early = subprocess.Popen(SLEEP, **quiet)
with open("early.pid", "w") as f:
    f.write(str(early.pid))
helper = subprocess.Popen([sys.executable, "-c", HELPER, os.environ["PROBE_LATE_S"], *SLEEP],
                          **quiet)
with open("helper.pid", "w") as f:
    f.write(str(helper.pid))
print(json.dumps("started"))
"""
LATE_S = 1.5  # when the helper starts the late grandchild, after the command's start
LEFT, ENDED = "left running", "ended"


def late_view(o: Outcome) -> Any:
    """Where the grandchildren are: natively and cold they are left running (nobody ends a
    process that left its session); warm, krex ends what a command left within its teardown
    bound (docs/pool.md): polled for well past the bound (and the daemon's 1 s tick), since a
    loaded machine makes the daemon late (seen under load in CI: both left at bound + 2.5 s)."""
    early_file, late_file, helper_file = (o.dir / f"{n}.pid" for n in ("early", "late", "helper"))
    pids: dict[str, int | None] = {"early": None, "late": None}
    helper: list[int] = []
    try:
        if early_file.exists():
            pids["early"] = int(early_file.read_text())
        if helper_file.exists():
            helper.append(int(helper_file.read_text()))
        if wait_for_file(late_file, LATE_S + 15):
            pids["late"] = int(late_file.read_text())
        live = [p for p in pids.values() if p is not None]
        if o.mode == "warm":
            bound = (o.teardown_s or 0.0) + 30.0
            left = wait_gone(live, max(0.0, o.ended + bound - time.monotonic()))
        else:
            time.sleep(0.3)
            left = wait_gone(live, 0.0)
        kill_all(live + helper)
        return {
            "status": o.status,
            **{k: None if p is None else (LEFT if p in left else ENDED) for k, p in pids.items()},
        }
    finally:
        for f in (early_file, late_file, helper_file):
            f.unlink(missing_ok=True)


add(
    probe(
        "late_grandchild",
        "grandchildren in sessions of their own, one started at once, one 1.5 s later by a "
        "helper (after the command ended): natively and cold left running; warm ended "
        "within the pool's teardown bound",
        LATE,
        caller=Caller(env={"PROBE_LATE_S": str(LATE_S)}),
        view=late_view,
        expect={
            "native": {"status": 0, "early": LEFT, "late": LEFT},
            "cold": {"status": 0, "early": LEFT, "late": LEFT},
            "warm": {"status": 0, "early": ENDED, "late": ENDED},
        },
        needs=frozenset({"teardown"}),
        timeout_s=60,
    ),
)


# torch on the GPU (skipped without torch and a real GPU's daemon).
TORCH = frozenset({"torch", "gpu"})
add(
    probe(
        "torch_device",
        "torch's view of the devices, before and after its first use",
        """
        import json, os, torch
        before = torch.cuda.is_initialized()
        print(json.dumps({"initialized_at_start": before,
                          "available": torch.cuda.is_available(),
                          "count": torch.cuda.device_count(),
                          "current": torch.cuda.current_device(),
                          "name": torch.cuda.get_device_name(0),
                          "capability": torch.cuda.get_device_capability(0)}))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_default_stream",
        "the current stream is the default (legacy) stream",
        """
        import json, torch
        s = torch.cuda.current_stream()
        print(json.dumps({"is_default": s == torch.cuda.default_stream(),
                          "handle": s.cuda_stream, "device": str(s.device)}))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_flags",
        "cuDNN and TF32 flags, matmul precision, determinism, default dtype",
        """
        import json, torch
        b = torch.backends
        print(json.dumps({
            "cudnn": [b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic,
                      b.cudnn.allow_tf32],
            "matmul_tf32": b.cuda.matmul.allow_tf32,
            "fp16_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "bf16_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "precision": torch.get_float32_matmul_precision(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(),
        }))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_allocator",
        "the caching allocator: its backend and settings, after one small allocation",
        """
        import json, os, torch
        x = torch.empty(1 << 20, device="cuda")
        print(json.dumps({"backend": torch.cuda.get_allocator_backend(),
                          "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                          "allocated": torch.cuda.memory_allocated(),
                          "reserved": torch.cuda.memory_reserved()}))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_compile_caches",
        "where Inductor and Triton put their caches (the caller's TORCHINDUCTOR_CACHE_DIR "
        "and TRITON_CACHE_DIR)",
        """
        import json, os, torch
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        from triton.runtime.cache import default_cache_dir
        print(json.dumps({"inductor": cache_dir(), "triton_default": default_cache_dir(),
                          "triton_env": os.environ.get("TRITON_CACHE_DIR")}))
        """,
        files={"inductor/.keep": "", "triton/.keep": ""},
        caller=Caller(
            env={"TORCHINDUCTOR_CACHE_DIR": "{dir}/inductor", "TRITON_CACHE_DIR": "{dir}/triton"}
        ),
        view=normed_value,
        needs=TORCH,
    ),
    probe(
        "torch_rng",
        "torch's RNG state at the start, on the CPU and the GPU: seeded from entropy (not "
        "c10's constant) and untouched (the first draws are those of the seed). The values "
        "themselves differ between any two runs natively; that two warm commands get seeds of "
        "their own is tests/test_pool_exit.py's",
        """
        import json, torch
        CONSTANT = 67280421310721  # c10's default_rng_seed_val


        def state(seed, draw, reseed):
            first = draw()
            reseed(seed)
            return {"constant": seed == CONSTANT, "untouched": torch.equal(first, draw())}


        print(json.dumps({
            "cpu": state(torch.initial_seed(), lambda: torch.rand(3), torch.manual_seed),
            "cuda": state(torch.cuda.initial_seed(), lambda: torch.rand(3, device="cuda"),
                          torch.cuda.manual_seed),
        }, sort_keys=True))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_threads",
        "torch's intra- and inter-op threads (they follow the CPU affinity)",
        """
        import json, torch
        print(json.dumps([torch.get_num_threads(), torch.get_num_interop_threads()]))
        """,
        needs=TORCH,
    ),
    probe(
        "torch_compile",
        "a tiny torch.compile on the GPU: its result and a clean exit",
        """
        import json, torch
        f = torch.compile(lambda x: (x * 2 + 1).sum())
        print(json.dumps(f(torch.ones(1024, device="cuda")).item()))
        """,
        needs=TORCH,
        timeout_s=300,
    ),
)

NAMES = [p.name for p in CATALOGUE]
assert len(NAMES) == len(set(NAMES)), "probe names are unique"
BY_NAME = {p.name: p for p in CATALOGUE}
