"""What a checkpoint costs at scale: size on disk and seconds to write and read it back.

    python tools/checkpoint_cost.py tools/stress/devices_100k.yaml --rounds 2

Runs the scenario's first rounds on the serial executor, then writes and reads the resulting
checkpoint with `raymm.driver.checkpoint` (best of --repeat), and, for comparison, the same state as
a pickle (the format raymm used before 0.2: written here only to measure it, never read back
by raymm). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pickle
import tempfile
import time
from pathlib import Path

from raymm.app.build import build_world, load_scenario
from raymm.driver import checkpoint
from raymm.sim.engine import run_rounds
from raymm.sim.serial import SerialExecutor


def best_of(repeat: int, fn) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenario")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    sc = load_scenario(args.scenario, [*args.overrides, "execution.executor=serial",
                                       "output.tensorboard=false"])
    world = build_world(sc)
    ex = SerialExecutor(None)
    ex.start(world)
    rows: list[dict] = []
    t0 = time.perf_counter()
    last = run_rounds(ex, sc.model_copy(update={"rounds": args.rounds}), 1,
                      lambda rec: rows.append(rec.row) or False)
    ckpt = checkpoint.Checkpoint(last, checkpoint.scenario_digest(sc.to_dict()),
                                 ex.server_state(), ex.host_states(), rows,
                                 time.perf_counter() - t0, {})
    out: dict = {"scenario": sc.name, "devices": sc.population.devices, "rounds": last}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        (run_dir / "config.yaml").write_text("{}\n")
        out["save_s"] = best_of(args.repeat, lambda: checkpoint.save(run_dir, ckpt, keep=1))
        files = sorted((run_dir / checkpoint.DIRNAME).iterdir())
        out["files"] = [f.name for f in files]
        out["bytes"] = sum(f.stat().st_size for f in files)
        out["load_s"] = best_of(args.repeat, lambda: checkpoint.load(run_dir))
        blob = run_dir / "pickle.pkl"
        state = dict(ckpt.__dict__)
        out["pickle_save_s"] = best_of(args.repeat, lambda: blob.write_bytes(
            pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)))
        out["pickle_bytes"] = blob.stat().st_size
        out["pickle_load_s"] = best_of(args.repeat, lambda: pickle.loads(blob.read_bytes()))
    ex.shutdown()
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
