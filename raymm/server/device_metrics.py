"""Per-device evaluation (`eval.scope: devices`): every device on its own test part.

Hosts evaluate their own devices with the model each would use
(`raymm.protocol.exchange.eval_vectors`) and return counts; the server turns the counts into the
metrics below, so serial and Ray runs compute the same numbers from the same counts.

- `accuracy` (ACC): mean over devices of local test accuracy with the sensors each holds;
- `acc_tier/<sensors>`: the same mean over each tier's devices (ACC_a, ACC_v, ...);
- `acc_multimodal` (ACC_m): the mean over devices holding two or more sensors;
- `acc_sensor/<m>` (ACC̄^(m)): mean over *every* device of its accuracy with only sensor m
  present, the others zeroed (every client, also those that lack m, as the FedMChain paper
  defines it; docs/methods/fedmchain.md);
- `mir`: max_m ACC̄^(m) / min_m ACC̄^(m) (inf when some ACC̄^(m) is 0);
- `acc_group/<g>`: with a grouped partition (`Population.data_group`), the mean over group g's
  devices (the groups are ground truth: shown in the row, never to a policy);
- `acc_<name>`: for each other predictor the objective offers (`eval_predict`, e.g. FedProto's
  nearest prototype, `acc_proto`), the mean over the devices it predicted for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raymm.protocol.messages import DeviceEval


def merge_evals(parts: list[DeviceEval]) -> DeviceEval:
    ids = np.concatenate([p.device_ids for p in parts])
    o = np.argsort(ids, kind="stable")
    names = sorted({k for p in parts for k in p.extra_correct})
    extra = {k: np.concatenate([p.extra_correct.get(k, np.full(p.device_ids.shape, -1))
                                for p in parts])[o].astype(np.int64) for k in names}
    return DeviceEval(ids[o], np.concatenate([p.n_test for p in parts])[o],
                      np.concatenate([p.correct for p in parts])[o],
                      np.concatenate([p.loss_sum for p in parts])[o],
                      np.concatenate([p.correct_only for p in parts])[o], extra)


def device_metrics(parts: list[DeviceEval], tier: np.ndarray,
                   tier_sensors: tuple[tuple[str, ...], ...],
                   sensors: tuple[str, ...], group: np.ndarray | None = None
                   ) -> dict[str, Any]:
    """ACC, per-tier ACC, ACC_m, per-sensor ACC̄^(m) and MIR from the hosts' counts (and
    per-group ACC given each device's data `group`)."""
    ev = merge_evals(parts)
    ok = ev.n_test > 0
    n = np.maximum(ev.n_test, 1)
    acc = ev.correct / n
    dev_tier = tier[ev.device_ids]
    out: dict[str, Any] = {
        "accuracy": _mean(acc[ok]),
        "test_loss": float(ev.loss_sum[ok].sum() / max(int(ev.n_test[ok].sum()), 1)),
    }
    for k, ts in enumerate(tier_sensors):
        out[f"acc_tier/{'+'.join(ts)}"] = _mean(acc[ok & (dev_tier == k)])
    multi = np.array([len(tier_sensors[k]) > 1 for k in dev_tier], dtype=bool)
    out["acc_multimodal"] = _mean(acc[ok & multi])
    if group is not None:
        dev_group = group[ev.device_ids]
        for g in np.unique(group).tolist():
            out[f"acc_group/{g}"] = _mean(acc[ok & (dev_group == g)])
    per = [_mean(ev.correct_only[ok, j] / n[ok]) for j in range(len(sensors))]
    for m, a in zip(sensors, per):
        out[f"acc_sensor/{m}"] = a
    out["mir"] = modality_imbalance_ratio(per)
    for what, c in ev.extra_correct.items():
        has = ok & (c >= 0)
        out[f"acc_{what}"] = _mean(c[has] / n[has])
    out["devices_evaluated"] = int(ok.sum())
    return out


def modality_imbalance_ratio(per_sensor: list[float]) -> float:
    """max / min of the per-sensor accuracies (NaN entries ignored; inf if the min is 0)."""
    vals = [v for v in per_sensor if v == v]
    if not vals:
        return float("nan")
    lo = min(vals)
    return float("inf") if lo == 0 else max(vals) / lo


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """The adjusted Rand index of two labellings of the same items (Hubert and Arabie): 1 for
    the same partition up to renaming, about 0 for independent ones; 1 when both put every
    item in one cluster (nothing to tell apart)."""
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    table = np.zeros((ia.max(initial=0) + 1, ib.max(initial=0) + 1), np.float64)
    np.add.at(table, (ia, ib), 1.0)

    def pairs(x: np.ndarray) -> float:
        return float((x * (x - 1) / 2).sum())

    index, rows, cols = pairs(table), pairs(table.sum(axis=1)), pairs(table.sum(axis=0))
    total = pairs(np.array([float(a.shape[0])]))
    expected = rows * cols / total if total > 0 else 0.0
    best = (rows + cols) / 2
    if best == expected:
        return 1.0
    return (index - expected) / (best - expected)


def cluster_recovery(assignment: dict[str, np.ndarray], senders: dict[str, np.ndarray],
                     truth: np.ndarray) -> dict[str, float]:
    """`ssca/ari`: the adjusted Rand index between the clusters a round's senders adopted
    (`ClusterModels.assignment`) and their true data groups, the mean over the groups of
    parameters synced (senders: device ids per parameter group)."""
    aris = [adjusted_rand_index(assignment[g][ids], truth[ids])
            for g, ids in senders.items() if g in assignment and ids.shape[0] > 1]
    return {"ssca/ari": float(np.mean(aris))} if aris else {}
