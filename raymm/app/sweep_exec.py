"""Running a sweep's jobs: one after the other in this process (`jobs=1`), or up to N at once,
each in a fresh process of its own (`python -m raymm.app.sweep_exec`, the job's scenario on stdin).

A run's numbers depend only on its scenario (every draw comes from (seed, round, device,
purpose) streams), so a run gives the same rounds table in its own process as in the sweep's;
nothing but the scenario is passed to it, and the plugins this process loaded that the child
must load too (`raymm.app.plugins.child_plugins`; the folders they were imported from go on the
child's PYTHONPATH). Each child gets max(1, cores // N) threads for
OpenMP/BLAS (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS, unless set already) and,
on an embedded local Ray, as many CPUs, so N runs do not oversubscribe the machine. torch's
intra-op threads stay the scenario's `execution.training.threads` (default 1): they are part of
what makes a run bit-identical, so a sweep never changes them.

A child's stdout and stderr go to `<run dir>.log`. A run that fails does not stop the others:
its failure is returned with the last line of its log. Ctrl-C stops the sweep: every running
child is asked once to stop after its round in flight (it writes a checkpoint), jobs not yet
started are not, and the same sweep command continues them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from raymm.app import api
from raymm.app.plugins import child_plugins, search_paths
from raymm.app.sweep_plan import Action, Job
from raymm.config.strict_yaml import dump_yaml, load_yaml
from raymm.errors import Interrupted, RaymmError

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class Outcome:
    """How one job went: `error` is the failure's last line (empty when it finished)."""

    job: Job
    seconds: float
    error: str = ""
    log: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.error


class SweepInterrupted(Interrupted):
    """Ctrl-C during a sweep: the runs in flight wrote checkpoints; the same command resumes."""

    def __init__(self) -> None:
        RaymmError.__init__(self, "sweep interrupted; the runs in flight stopped after their "
                                  "round and wrote a checkpoint. Run the same sweep command "
                                  "again to continue: finished runs are skipped")


def cpu_count() -> int:
    """CPUs this process may use (its affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_job(jobs: int) -> int:
    return max(1, cpu_count() // max(jobs, 1))


def run_jobs(todo: Sequence[tuple[Job, Action]], jobs: int, progress: bool,
             report: Callable[[Outcome], None]) -> list[Outcome]:
    """Run `todo` (action new, resume or restart each), `jobs` at a time; `report` is called
    as each one ends. Returns the outcomes in `todo`'s order."""
    if jobs <= 1:
        outcomes = []
        for job, action in todo:
            outcomes.append(run_here(job, action, progress))
            report(outcomes[-1])
        return outcomes
    return _ChildPool(jobs).run(todo, report)


def run_here(job: Job, action: Action, progress: bool) -> Outcome:
    """One job in this process. A run that fails is an outcome, not an exception; Ctrl-C
    stops the sweep."""
    t0 = time.perf_counter()
    try:
        _run_job(job, action, progress)
    except Interrupted:
        raise SweepInterrupted() from None
    except RaymmError as exc:
        return Outcome(job, time.perf_counter() - t0, _last_line(str(exc)))
    except Exception as exc:  # a bug in one run: shown in full, the others still run
        traceback.print_exc()
        return Outcome(job, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")
    return Outcome(job, time.perf_counter() - t0)


def _run_job(job: Job, action: Action, progress: bool) -> None:
    if action == "restart":  # same configuration, no checkpoint: nothing to keep
        shutil.rmtree(job.run_dir)
    resume = job.run_dir if action == "resume" else None
    api.run(job.scenario, resume=resume, run_dir=job.run_dir, progress=progress)


def run_in_threads(todo: Sequence[tuple[Job, Action]],
                   work: Callable[[Job, Action], Outcome], report: Callable[[Outcome], None],
                   at_once: int, name: str, on_interrupt: Callable[[], None]) -> list[Outcome]:
    """`work` for every job, up to `at_once` at a time, each outcome reported as it ends and
    all returned in the order of `todo`; on Ctrl-C, `on_interrupt` (ask the running ones to
    stop), wait for them, and raise SweepInterrupted."""
    pool = ThreadPoolExecutor(at_once, thread_name_prefix=name)
    futures = {pool.submit(work, job, action): i for i, (job, action) in enumerate(todo)}
    outcomes: list[Outcome | None] = [None] * len(todo)
    try:
        for f in as_completed(futures):
            outcomes[futures[f]] = f.result()
            report(f.result())
    except KeyboardInterrupt:
        on_interrupt()
        pool.shutdown(wait=True, cancel_futures=True)
        raise SweepInterrupted() from None
    pool.shutdown(wait=True)
    return [o for o in outcomes if o is not None]


class _ChildPool:
    """Up to `jobs` child processes at once, each waited on by a thread of its own."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.threads = threads_per_job(jobs)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen[str]] = set()

    def run(self, todo: Sequence[tuple[Job, Action]],
            report: Callable[[Outcome], None]) -> list[Outcome]:
        return run_in_threads(todo, self.run_child, report, self.jobs, "raymm-sweep",
                              self.stop)

    def stop(self) -> None:
        """Ask each running child once to stop after its round (children run in sessions of
        their own, so the terminal's Ctrl-C reached only this process; a second one would
        make them abort without a checkpoint)."""
        self.stopping.set()
        with self.lock:
            for proc in self.running:
                proc.send_signal(signal.SIGINT)

    def run_child(self, job: Job, action: Action) -> Outcome:
        """The job in a child process; anything that goes wrong on this side (a log that
        cannot be written) is the job's failure too, not the sweep's."""
        if self.stopping.is_set():
            return Outcome(job, 0.0, "not started: the sweep was interrupted")
        t0 = time.perf_counter()
        try:
            return self._child(job, action, t0)
        except Exception as exc:
            return Outcome(job, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")

    def _child(self, job: Job, action: Action, t0: float) -> Outcome:
        if action == "restart":
            shutil.rmtree(job.run_dir)
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log, "a", encoding="utf-8") as log:
            log.write(f"# raymm sweep: {job.label}, {action}, {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      f" -> {job.run_dir}\n")
            log.flush()
            proc = subprocess.Popen([sys.executable, "-m", "raymm.app.sweep_exec"], text=True,
                                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    env=self.child_env(job), start_new_session=True)
            with self.lock:
                self.running.add(proc)
                if self.stopping.is_set():   # started while `stop` was signalling the others
                    proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(child_input(job, action, self.threads))
            finally:
                with self.lock:
                    self.running.discard(proc)
        seconds = time.perf_counter() - t0
        if proc.returncode == 0:
            return Outcome(job, seconds, log=job.log)
        last = _last_line(job.log.read_text(encoding="utf-8", errors="replace"))
        return Outcome(job, seconds, last or f"exit code {proc.returncode}", job.log)

    def child_env(self, job: Job | None = None) -> dict[str, str]:
        env = dict(os.environ, RAYMM_NO_PROGRESS="1")
        for var in THREAD_VARS:
            env.setdefault(var, str(self.threads))
        extra = search_paths(child_plugins(job.scenario)) if job is not None else []
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(
                [p for p in (env.get("PYTHONPATH", ""), *extra) if p])
        return env


def child_input(job: Job, action: Action, cpus: int) -> str:
    """The job as YAML for the child: its scenario (on a local embedded Ray with its CPUs
    unset, `cpus` of them: execution.* is not part of a run's identity), its directory and
    whether it resumes."""

    sc = job.scenario.to_dict()
    ex = sc["execution"]
    if ex["executor"] == "ray" and ex.get("address") is None and ex.get("local_num_cpus") is None:
        ex["local_num_cpus"] = cpus
    return dump_yaml({"scenario": sc, "run_dir": str(job.run_dir),
                      "resume": action == "resume", "plugins": child_plugins(job.scenario)})


def _last_line(text: str) -> str:
    """The error's last line in a log or message (without the `raymm: ` of the CLI)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("# ")]
    return lines[-1].removeprefix("raymm: ") if lines else ""


def child_main() -> int:
    """A child's entry: run the job read from stdin; exit codes as `raymm run`'s (2: the run's
    input or data was refused, 130: interrupted with a checkpoint written)."""

    job = load_yaml(sys.stdin.read())
    run_dir = Path(job["run_dir"])
    try:
        result = api.run(job["scenario"], resume=run_dir if job["resume"] else None,
                         run_dir=run_dir, progress=False, plugins=job.get("plugins", []))
    except Interrupted as exc:
        print(f"raymm: {exc}", file=sys.stderr)
        return 130
    except RaymmError as exc:
        print(f"raymm: {exc}", file=sys.stderr)
        return 2
    s = result.summary
    print(f"{s['name']}: {s['rounds_completed']} rounds, final accuracy "
          f"{s['final_accuracy']}, {s['wall_seconds']:.1f} s wall; run directory "
          f"{result.run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
