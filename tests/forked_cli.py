"""`python -m raymm.app.cli ARGS` for many commands, each in a process forked from one that has
imported raymm, torch and Ray once.

A fresh interpreter pays 3-5 s of imports before a command does anything; `test_doc_commands`
runs about 35 commands, so imports were half of its time. `ForkedCli` starts this file as a
server: it imports `PRELOAD`, then for each request (one JSON line on stdin) forks a child that
takes the request's working directory, environment, `sys.path` entries of its PYTHONPATH and
argv, writes its stdout and stderr to files, and runs `raymm.app.cli.main` as the module's
`__main__` does, then exits with its code after the interpreter's exit handlers. So every
command still runs in a process of its own, with its own exit code and output; what it shares
with the others is modules imported before it started (none of raymm's reads the environment
when imported).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

PRELOAD = ("torch", "ray", "pandas", "raymm.app.cli", "raymm.app.api", "raymm.app.sweep",
           "raymm.app.bench")


def _child(req: dict[str, Any]) -> None:
    """Runs one command in the forked child; never returns."""
    code = 1
    try:
        signal.alarm(int(req["timeout"]))   # the default action ends the process
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # `python -m` puts the working directory first, then PYTHONPATH's entries (here in
        # place of this file's folder)
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:1] = [os.getcwd(), *(p for p in extra if p not in sys.path)]
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(os.devnull)
        sys.argv = ["raymm", *req["argv"]]
        from raymm.app.cli import main
        code = main(req["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


class ForkedCli:
    """The server as a child process of the test: `run` one command at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raymm-cli-"))
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=Path(__file__).resolve().parents[1])
        self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forked CLI server ended ({self.proc.wait()})")
        return json.loads(line)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess[str]:
        out, err = self.dir / "stdout", self.dir / "stderr"
        req = {"argv": argv, "cwd": str(cwd), "env": env, "timeout": timeout,
               "stdout": str(out), "stderr": str(err)}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        code = self._reply()["code"]
        return subprocess.CompletedProcess(["raymm", *argv], code, out.read_text(),
                                           err.read_text())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        for f in self.dir.iterdir():
            f.unlink()
        self.dir.rmdir()


if __name__ == "__main__":
    serve()
