"""Running a sweep's jobs (raymm.app.sweep_exec): each child process gets its share of the
cores."""

from __future__ import annotations

from raymm.app.sweep_exec import THREAD_VARS, _ChildPool, threads_per_job


def test_each_child_gets_its_share_of_the_cores(monkeypatch) -> None:
    monkeypatch.setattr("raymm.app.sweep_exec.cpu_count", lambda: 16)
    assert [threads_per_job(n) for n in (1, 3, 16, 40)] == [16, 5, 1, 1]
    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")   # set by the user: kept
    env = _ChildPool(4).child_env()
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == \
        ("4", "7", "4")
