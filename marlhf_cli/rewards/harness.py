"""The code that runs *inside* the sandbox, around the untrusted program.

:mod:`.sandbox` reads this file's text and hands it to a fresh interpreter with
``python -I -S -c`` (it imports only :func:`compile_program` from it), so it must stay
standard-library only and compatible with the oldest interpreter a sandbox may pick (the
system's ``python3``; 3.8+).

Why a harness instead of ``python solution.py``:

* the parent can tell a compile error (exit 111) and a memory error (exit 112) from an
  ordinary crash without parsing tracebacks;
* call-based APPS problems (``fn_name``) need the function called with the test's argument
  list, and the result written where the program's own prints cannot mix with it: the real
  stdout is moved to a private descriptor and fd 1 points at stderr while user code runs;
* the soft CPU limit (SIGXCPU) ends the program with exit 115 even where it is a PID
  namespace's init, which ignores signals' default actions;
* where the OS gives no network namespace, sockets are disabled here before user code runs
  (best effort: ctypes or a subprocess can still reach the network; the sandbox says so).

argv: ``MODE BLOCK_NET LIMITS PROGRAM INPUT [FN_NAME]`` with MODE ``stdin`` or ``call`` and
LIMITS like ``CPU=4:5,AS=1073741824:1073741824,NPROC=16:16`` (set first of all: the parent
sets none, so that it can start this process with vfork).

:func:`compile_program` is also imported by the parent (the pre-run compile check), so the
two always agree on what compiles.
"""

import sys

EXIT_COMPILE = 111
EXIT_MEMORY = 112
EXIT_NO_FUNCTION = 113
EXIT_BAD_RESULT = 114
EXIT_CPU = 115
EXIT_SETUP = 116


def compile_program(source):
    """Compile a program; a top-level ``return`` is allowed, as APPS allows it.

    APPS's judge runs standard-input programs inside a function, so some of its reference
    solutions end early with a module-level ``return``. Such a program is compiled as the
    body of a function called once (its imports stay at module level, and names any nested
    function declares ``global`` are declared global in the wrapper too, so they still work).
    """
    try:
        return compile(source, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as err:
        if "'return' outside function" not in str(err.msg):
            raise
    import ast

    tree = ast.parse(source, "solution.py")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    shared = sorted({name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names})
    if shared:
        body.insert(0, ast.Global(names=shared))
    arguments = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    function = ast.FunctionDef(
        name="_solution_main", args=arguments, body=body or [ast.Pass()], decorator_list=[], returns=None,
        type_comment=None,
    )
    if "type_params" in ast.FunctionDef._fields:
        function.type_params = []
    call = ast.Expr(ast.Call(func=ast.Name(id="_solution_main", ctx=ast.Load()), args=[], keywords=[]))
    tree.body = imports + [function, call]
    ast.fix_missing_locations(tree)
    return compile(tree, "solution.py", "exec", dont_inherit=True)


def _block_network():
    import socket

    def refuse(*args, **kwargs):
        raise OSError(101, "network access is disabled in the sandbox")

    for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        if hasattr(socket, name):
            setattr(socket, name, refuse)
    import _socket

    for name in ("socket", "socketpair", "fromfd", "getaddrinfo"):
        if hasattr(_socket, name):
            setattr(_socket, name, refuse)


def _prelude():
    """Names call-based APPS solutions use without importing them (LeetCode's implicit imports)."""
    import bisect
    import collections
    import functools
    import heapq
    import itertools
    import math
    import typing

    names = {name: getattr(typing, name) for name in getattr(typing, "__all__", []) if hasattr(typing, name)}
    names.update(
        bisect=bisect, collections=collections, functools=functools, heapq=heapq, itertools=itertools,
        math=math, sys=sys, deque=collections.deque, defaultdict=collections.defaultdict,
        Counter=collections.Counter, OrderedDict=collections.OrderedDict, lru_cache=functools.lru_cache,
        reduce=functools.reduce, heappush=heapq.heappush, heappop=heapq.heappop, heapify=heapq.heapify,
        bisect_left=bisect.bisect_left, bisect_right=bisect.bisect_right, gcd=math.gcd, inf=math.inf,
    )
    return names


def _jsonable(value):
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    return repr(value)


def _apply_limits(spec):
    import resource

    for item in spec.split(","):
        if item:
            name, values = item.split("=")
            soft, hard = (int(value) for value in values.split(":"))
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))


def _on_cpu_limit(signum, frame):
    import os

    os._exit(EXIT_CPU)


def main():
    import builtins
    import os
    import signal

    # as a PID namespace's init the program would ignore SIGXCPU (default actions do not
    # apply to pid 1), so the soft CPU limit ends it here; the hard limit still kills
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    mode, block_net, limits, program_path, input_path = sys.argv[1:6]
    fn_name = sys.argv[6] if len(sys.argv) > 6 else ""
    try:
        _apply_limits(limits)
    except Exception as err:  # fail closed: never run the program without its limits
        sys.stderr.write("sandbox setup failed: %s\n" % err)
        sys.stderr.flush()
        os._exit(EXIT_SETUP)
    with open(program_path, encoding="utf-8", errors="replace") as handle:
        source = handle.read()
    try:
        code = compile_program(source)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as err:
        sys.stderr.write("compile error: %s: %s\n" % (type(err).__name__, err))
        sys.stderr.flush()
        os._exit(EXIT_COMPILE)
    if block_net == "1":
        _block_network()
    namespace = {"__builtins__": builtins, "__file__": "solution.py"}
    sys.argv = ["solution.py"]
    try:
        if mode == "stdin":
            namespace["__name__"] = "__main__"
            exec(code, namespace)
            return
        import json

        with open(input_path, encoding="utf-8") as handle:
            args = json.load(handle)
        if not isinstance(args, list):
            args = [args]
        result_fd = os.dup(1)
        os.dup2(2, 1)  # the program's prints go to stderr; the result alone to result_fd
        namespace["__name__"] = "solution"
        namespace.update(_prelude())
        exec(code, namespace)
        holder = namespace.get("Solution")
        function = getattr(holder(), fn_name, None) if isinstance(holder, type) else None
        if function is None:
            function = namespace.get(fn_name)
        if not callable(function):
            sys.stderr.write("no function named %r\n" % fn_name)
            sys.stderr.flush()
            os._exit(EXIT_NO_FUNCTION)
        result = function(*args)
        try:
            data = json.dumps(result, default=_jsonable)
        except (TypeError, ValueError) as err:
            sys.stderr.write("result is not JSON-serialisable: %s\n" % err)
            sys.stderr.flush()
            os._exit(EXIT_BAD_RESULT)
        sys.stdout.flush()
        payload = memoryview(data.encode("utf-8"))
        while payload:
            payload = payload[os.write(result_fd, payload):]
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        sys.stderr.flush()
        os._exit(EXIT_MEMORY)


if __name__ == "__main__":
    main()
