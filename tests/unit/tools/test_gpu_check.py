"""tools/gpu_check.py's repeatability part, on the CPU: the same sha twice, and its sentence
when two runs differ."""

from __future__ import annotations

from helpers import REPO, load_script


def test_gpu_check_repeat_part_on_cpu(tmp_path, capsys):
    """gpu_check's repeatability part, on the CPU here: the same sha twice, and its sentence."""
    gpu_check = load_script(REPO / "tools" / "gpu_check.py")
    res = gpu_check.main(["--out", str(tmp_path), "--cpu-only", "--parts", "repeat",
                          "--repeat-rounds", "1"])
    rep = res["repeat"]
    assert rep["device"] == "cpu" and rep["same"]
    for mode in ("sequential", "lockstep"):
        a, b = rep["runs"][mode]["sha"]
        assert a == b and len(a) == 64
    out = capsys.readouterr().out
    assert "deterministic on CPU" in out and "same sha" in out
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# GPU check") and "0. deterministic on CPU" in md
    assert not [line for line in md.splitlines() if line[:2] in ("1.", "2.", "3.")]  # asked: 0
    # the sentence when two runs differ names the difference and torch's warnings
    differ = {"same": False, "rounds": 3, "nondeterministic_ops":
              ["adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation"],
              "runs": {"sequential": {"same": True, "sha": ["a" * 64] * 2},
                       "lockstep": {"same": False, "sha": ["b" * 64, "c" * 64],
                                      "max_abs_diff": 3e-8}}}
    line = gpu_check.repeat_line(differ, "NVIDIA H100")
    assert line.startswith("NOT deterministic on NVIDIA H100: sequential: same sha; "
                           "lockstep: bbbbbbbbbbbb vs cccccccccccc, largest difference 3e-08")
    assert "adaptive_avg_pool2d_backward_cuda" in line
