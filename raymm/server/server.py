"""The server: global parameter groups, observations, selection, aggregation, evaluation.

Every decision is a call into a policy; the server only sequences them and keeps the books.
The Ray `ServerActor` is a thin shell around this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raymm import seeding
from raymm.config.schema import Scenario
from raymm.data.base import Dataset
from raymm.data.mapped import file_maps, release_pages
from raymm.models import GroupLayout
from raymm.models.build import build_model
from raymm.phases import phase
from raymm.population.devices import Population
from raymm.population.faults import stragglers
from raymm.protocol.exchange import downloads, sync_window
from raymm.protocol.messages import (
    MODALITY_CORRECT,
    Broadcast,
    DeviceEval,
    HostResult,
    OnlineReport,
    RoundPlan,
    UpdateBatch,
    merge_results,
    plan_from_state,
    plan_state,
)
from raymm.protocol.observations import Observations
from raymm.protocol.record import RoundRecord
from raymm.protocol.seams import (
    AggregationContext,
    Aggregator,
    EvalFeedback,
    ModalityReport,
    Schedule,
    SelectionContext,
    Selector,
    ServerPolicy,
)
from raymm.protocol.traffic import comm_seconds, downlink_bytes
from raymm.server import divergence
from raymm.server.clock import RoundClock
from raymm.server.device_metrics import cluster_recovery, device_metrics
from raymm.server.evaluation import SubsetEvaluator, subset_name
from raymm.server.robustness import robustness_metrics
from raymm.units import FLOAT_BYTES


@dataclass(frozen=True)
class Policies:
    selector: Selector
    aggregator: Aggregator
    schedule: Schedule


class Server:
    def __init__(self, scenario: Scenario, dataset: Dataset, population: Population,
                 policies: Policies) -> None:
        torch.set_num_threads(scenario.execution.training.threads)
        self.sc = scenario
        self.dataset = dataset
        # the memory maps of the test inputs (none in memory): let go of after each evaluation
        self._test_maps = file_maps(dataset.test)
        self.sensors = dataset.sensors
        self.policies = policies
        self.model = build_model(dataset, scenario.model, scenario.seed)
        self.layout = GroupLayout(self.model, self.sc.model.buffers)
        self.params = self.layout.flatten(self.model, self.layout.groups)
        self.obs = Observations.register(population.sensor_mask, population.tier)
        self.tier_sensors = population.tier_sensors
        # ground truth of a grouped partition: per-group accuracy and the clusters' ARI in the
        # rows; never shown to a policy
        self._data_group = population.data_group
        # simulator bookkeeping only (simulated comm time); never shown to a policy
        self._up_bps, self._down_bps = population.up_bps, population.down_bps
        self.bytes_up = self.bytes_down = 0
        self.sim_seconds = 0.0
        # what the server has sent, to count downloads honestly: the round each device last
        # received the vectors it trains (periodic sync), and which devices hold a final copy
        # of each frozen group (a chain's earlier modalities, sent once)
        self.last_download = np.zeros(population.n, np.int64)
        self.frozen_sent: dict[str, np.ndarray] = {}
        self._round = 0  # the last round aggregated (what a per-device evaluation belongs to)
        # the plan of a round not aggregated yet: a plan made ahead (`plan` before the previous
        # round's checkpoint) is part of the state, so a resumed run trains the same plan
        self._planned: tuple[RoundPlan, Broadcast] | None = None
        # clock.mode: seconds (raymm.server.clock): availability read at the server's clock
        self.clock = RoundClock(scenario, population) if scenario.clock.mode == "seconds" \
            else None
        self.privacy: Any = None  # a `raymm.server.privacy.PrivacyLedger` when privacy is on
        if scenario.privacy.on:
            # deferred: dp-accounting (about a second to import) loads for private runs only
            from raymm.server.privacy import PrivacyLedger

            self.privacy = PrivacyLedger(
                scenario, population, {g: self.layout.sizes[g] for g in self.layout.groups},
                policies.schedule, policies.aggregator.combinable)

    # --- one round ------------------------------------------------------------------------
    @phase("server.plan")
    def plan(self, t: int, reports: list[OnlineReport]) -> tuple[RoundPlan, Broadcast]:
        """Selection (who) and schedule (which groups); the payload to put in the store once.
        Round t's plan is made once: asked again (a run resumed after it was made ahead), the
        server answers with the plan it made, whatever the reports."""
        if self._planned is not None and self._planned[0].round == t:
            return self._planned
        if self.clock is not None:  # who is available at the round's start (seconds clock)
            online = self.clock.begin(self.sim_seconds)
            self.obs.observe_online(online, self.clock.num_samples[online])
        elif reports:
            ids = np.concatenate([r.device_ids for r in reports])
            self.obs.observe_online(ids, np.concatenate([r.num_samples for r in reports]))
            online = np.sort(ids)
        else:
            online = np.zeros(0, np.int64)
        sched = self.policies.schedule
        sched.begin_round(t, self.obs)  # a schedule that decides as it goes decides here
        eligible = online[sched.eligible(t, self.obs.sensor_mask[online], self.sensors)]
        if self.privacy is not None:  # devices at the participation cap are not eligible
            eligible = self.privacy.eligible(eligible)
        # under privacy the draw may come from a secret stream, or be the ledger's own
        # Poisson sample (what amplification by sampling is accounted for)
        drawn = None if self.privacy is None else self.privacy.sample(t, eligible)
        if drawn is None:
            rng = seeding.rng(self.sc.seed, t, seeding.SERVER, "selection") \
                if self.privacy is None else self.privacy.selection_rng(t)
            ctx = SelectionContext(t, online, eligible, self._k_select(), self.obs, rng,
                                   self._published())
            selected = np.sort(np.asarray(self.policies.selector.select(ctx), dtype=np.int64))
            self._check_selection(selected, eligible)
            train_sensors = self._train_sensors(selected)
        else:  # a Poisson cohort: any size, every member eligible by construction
            selected, train_sensors = drawn, None
        self.obs.observe_selected(t, selected)
        active = sched.active_groups(t, self.layout.groups)
        for g in active:  # a group trained again: every frozen copy sent of it is now stale
            self.frozen_sent.pop(g, None)
        first, upload = sync_window(t, self.sc, sched)
        if self.privacy is not None:
            self.privacy.planned(t, eligible, selected, upload)
        plan = RoundPlan(t, selected, active, self._downloads(t, selected, first), upload,
                         tuple(sched.report_sensors(t)), train_sensors)
        self._last_counts = (len(online), len(eligible))
        self._planned = (plan, self._broadcast(t, self._extras(t)))
        return self._planned

    def _published(self) -> dict[str, np.ndarray]:
        """The aggregator's per-device statistics for selection (`selection_view`), as
        read-only views: the selector may read them, never change the aggregator's state."""
        out = {}
        for name, value in self.policies.aggregator.selection_view().items():
            view = np.asarray(value).view()
            view.flags.writeable = False
            out[name] = view
        return out

    def _train_sensors(self, selected: np.ndarray) -> np.ndarray | None:
        """The selector's per-device sensors for this round (`train_sensors`), within what each
        device holds; every device must keep at least one."""
        asked = self.policies.selector.train_sensors(selected)
        if asked is None:
            return None
        asked = np.asarray(asked, bool)
        if asked.shape != (selected.shape[0], len(self.sensors)):
            raise RuntimeError("selection policy's train_sensors is not a bool array "
                               "[selected, sensors]")
        mask = asked & self.obs.sensor_mask[selected]
        if not mask.any(axis=1).all():
            raise RuntimeError("selection policy's train_sensors leaves a selected device "
                               "no sensor it holds")
        return mask

    def _extras(self, t: int) -> dict[str, np.ndarray]:
        """What travels with the model this round: the aggregator's extras (e.g. prototypes)
        and the schedule's (e.g. an adaptive chain's predecessors)."""
        out = {**self.policies.aggregator.extras(t), **self.policies.schedule.extras(t)}
        return out if self.privacy is None else {**out, **self.privacy.extras()}

    def _downloads(self, t: int, selected: np.ndarray, window_start: int) -> np.ndarray:
        """bool per selected device: it receives the vectors it trains (`exchange.downloads`)."""
        fresh = downloads(self.sc.training.exchange, self.last_download[selected], window_start)
        self.last_download[selected[fresh]] = t
        return fresh

    def _broadcast(self, t: int, extras: dict[str, np.ndarray]) -> Broadcast:
        """Global vectors, plus cluster models when the aggregator keeps them."""
        return Broadcast(t, self.params, extras, self.policies.aggregator.cluster_models())

    @phase("server.aggregate")
    def aggregate(self, t: int, plan: RoundPlan, results: list[HostResult],
                  lost: np.ndarray | None = None) -> RoundRecord:
        """Merge the hosts' results (sorted by device id), drop stragglers, aggregate, and count
        traffic and time. `lost` lists selected devices whose host died this round."""
        self._planned = None
        batch = merge_results(results)
        fallbacks = batch.lockstep_fallbacks
        down = self._downlink(plan)
        up = self._uplink(batch)
        dev_seconds = batch.compute_seconds + comm_seconds(
            down[np.searchsorted(plan.selected, batch.device_ids)], up,
            self._down_bps[batch.device_ids], self._up_bps[batch.device_ids])
        late = stragglers(self.sc.faults, dev_seconds) if self.clock is None \
            else self.clock.close(batch.device_ids, dev_seconds)
        self._observe_times(batch, lost)
        if late.any():  # the server closes the round at the deadline without them
            batch, up, dev_seconds = batch.subset(~late), up[~late], dev_seconds[~late]
        ctx = AggregationContext(t, self.sensors, self.obs, self.sc.seed)
        agg_stats: dict[str, Any] = {}
        bad: list[int] | None = None
        private = self.privacy is not None and plan.upload
        if private:  # noise once per round, on the sum; released even if nobody sent
            batch = self.privacy.release(t, plan, self.params, batch)
        if batch.n or private:
            merged = self.policies.aggregator.aggregate(self.params, batch, ctx)
            agg_stats = dict(self.policies.aggregator.round_stats())
            clusters = self.policies.aggregator.cluster_models()
            if self._data_group is not None and clusters is not None and agg_stats:
                agg_stats.update(cluster_recovery(clusters.assignment, {
                    g: batch.device_ids[batch.senders[g]] for g in batch.updates},
                    self._data_group))
            bad = divergence.diverged(batch.device_ids, batch.loss, merged)
            if bad is None:
                self.params = merged
            # else: keep the last finite model; the run stops after this round
        if plan.report:  # the schedule asked for unimodal accuracies (`report_sensors`)
            correct = batch.reports.get(
                MODALITY_CORRECT, np.full((batch.n, len(self.sensors)), -1, np.int32))
            self.policies.schedule.observe(
                ModalityReport(t, batch.device_ids, batch.num_samples, correct))
        self._round = t
        deadline = self.sc.faults.deadline_seconds
        round_time = float(dev_seconds.max()) if batch.n else 0.0
        if late.any() and deadline is not None:
            round_time = deadline
        clock_row = {}
        if self.clock is not None:  # the round's end by clock.round_end, idle time before it
            round_time = self.clock.duration
            clock_row = self.clock.row()
            self.sim_seconds = self.clock.start
        self.bytes_down += int(down.sum())
        self.bytes_up += int(up.sum())
        self.sim_seconds += round_time
        n_lost = 0 if lost is None else int(len(lost))
        return RoundRecord({
            "round": t, "phase": self.policies.schedule.phase(t),
            "online": self._last_counts[0], "eligible": self._last_counts[1],
            "selected": int(plan.selected.shape[0]), "participated": batch.n,
            "failed": int(batch.failed.shape[0]), "lost": n_lost,
            "stragglers": int(late.sum()),
            # devices a lock-step program handed to sequential training: slower, same numbers
            "lockstep_fallbacks": sum(fallbacks.values()),
            "bytes_down": int(down.sum()), "bytes_up": int(up.sum()),
            "bytes_total": self.bytes_up + self.bytes_down,
            "sim_seconds": round_time, "sim_seconds_total": self.sim_seconds,
            "train_loss": float(np.average(batch.loss, weights=batch.num_samples))
            if batch.n else float("nan"),
            **clock_row, **agg_stats, **self._policy_stats(),
            **(self.privacy.account(t) if self.privacy is not None else {}),
        }, selected=plan.selected, diverged=bad,
            device_epsilon=None if self.privacy is None else self.privacy.last_device_epsilon,
            lockstep_fallbacks=dict(fallbacks))

    def _observe_times(self, batch: UpdateBatch, lost: np.ndarray | None) -> None:
        """Record the simulated training time of every selected device that trained, or tried
        to, before the deadline drops anyone: a device past the deadline with the time it would
        have needed (its host computed it), so an always-late device's speed score falls
        instead of keeping its starting value. A device that never answered (it crashed, or
        its host died) is recorded with a penalty: the round's longest training time, and at
        least the deadline when one is set, since the server waited that long in vain."""
        self.obs.observe_trained(batch.device_ids, batch.compute_seconds)
        silent = batch.failed if lost is None else np.union1d(batch.failed, lost)
        if silent.size == 0:
            return
        deadline = self.sc.faults.deadline_seconds
        longest = float(batch.compute_seconds.max()) if batch.n else 0.0
        penalty = max(longest, deadline if deadline is not None else 0.0)
        if penalty > 0:
            self.obs.observe_trained(silent.astype(np.int64), np.full(silent.shape[0], penalty))

    def _policy_stats(self) -> dict[str, float]:
        """Columns the selector and the schedule add to the round's row (`round_stats()`, e.g.
        the selection weights used or the chain's phase)."""
        out: dict[str, float] = {}
        for policy in (self.policies.selector, self.policies.schedule):
            out.update(policy.round_stats())
        return out

    def _downlink(self, plan: RoundPlan) -> np.ndarray:
        """Bytes sent to each selected device: its groups and the round's extras when it
        downloads, plus a one-time copy of every frozen group it needs (see `_frozen_bytes`)."""
        down = downlink_bytes(plan.training_masks(self.obs.sensor_mask[plan.selected]),
                              self.sensors,
                              plan.active_groups, self.sc.training.upload, self.layout.sizes,
                              FLOAT_BYTES * self._missing_sensor_floats())
        if self.sc.training.exchange == "personal":  # parameters never travel, extras do
            down = np.zeros_like(down)
        down = down + sum(int(v.nbytes) for v in self._extras(plan.round).values())
        # periodic sync between a device's downloads, or Local: nothing is sent
        down = np.where(plan.download_mask(), down, 0)
        return down + self._frozen_bytes(plan)

    def _missing_sensor_floats(self) -> int:
        """What a pod-wise device needs of a sensor it lacks to run the fusion layer: the
        embedding of a zero input (E floats), or with the first weight split per sensor
        (`model.fusion_blocks: sensor`, whose block W^(m) it does not receive) the product
        W^(m) e_m(0) (fusion_dim floats)."""
        model = self.sc.model
        return model.fusion_dim if model.fusion_blocks == "sensor" and \
            model.fusion == "concat" else model.embed_dim

    def _frozen_bytes(self, plan: RoundPlan) -> np.ndarray:
        """A chain's earlier modalities are frozen and final once their phase ended: a device
        training on top of them (`schedule.frozen_groups`) receives each one it holds once."""
        out = np.zeros(plan.selected.shape, np.int64)
        if self.sc.training.exchange in ("none", "personal"):
            return out
        mask = self.obs.sensor_mask[plan.selected]
        for g in self.policies.schedule.frozen_groups(plan.round):
            sent = self.frozen_sent.setdefault(g, np.zeros(self.obs.n, bool))
            need = mask[:, self.sensors.index(g.partition(":")[2])] & ~sent[plan.selected]
            out += need.astype(np.int64) * self.layout.sizes[g] * FLOAT_BYTES
            sent[plan.selected[need]] = True
        return out

    def _uplink(self, batch: Any) -> np.ndarray:
        """Bytes each returning device actually sent: its trained groups and its extras."""
        up = np.zeros(batch.n, np.int64)
        for g in batch.groups():
            np.add.at(up, batch.sent(g), self.layout.sizes[g] * FLOAT_BYTES)
        # per-device extras, e.g. class means; an aggregator that knows which parts of them
        # carry something (FedProto: only the classes a device holds) counts them itself
        for v in batch.reports.values():  # what the server asked for: only what was reported
            up += (v >= 0).reshape(batch.n, -1).sum(axis=1) * v.itemsize
        return up + self.policies.aggregator.extras_uplink_bytes(batch)

    def _check_selection(self, selected: np.ndarray, eligible: np.ndarray) -> None:
        # `selected` is sorted and `eligible` ascending (online ids, sorted, masked): a binary
        # search per selected device instead of np.isin's sort of all eligible ones
        if eligible.shape[0] and np.all(eligible[1:] > eligible[:-1]):
            pos = np.minimum(np.searchsorted(eligible, selected), eligible.shape[0] - 1)
            known = eligible[pos] == selected
        else:  # a schedule that named devices out of order
            known = np.isin(selected, eligible)
        bound = eligible.shape[0] if self.policies.selector.every_eligible else \
            self._k_select()
        if selected.shape[0] > bound or not known.all() \
                or np.any(selected[1:] == selected[:-1]):
            raise RuntimeError("selection policy returned devices that are not eligible, "
                               "repeated, or more than k")

    def _k_select(self) -> int:
        """How many devices selection may pick: k, or ceil(k·(1+o)) with over-commitment."""
        return self.sc.selection.k if self.clock is None else self.clock.k_select

    # --- evaluation -----------------------------------------------------------------------
    @phase("server.evaluate")
    def evaluate(self, t: int) -> RoundRecord:
        """Global model on the pooled test split: all sensors, each tier's sensors, each sensor
        (and the confusion matrix of all sensors)."""
        self.layout.load(self.model, self.params)
        split, bs = self.dataset.test, self.sc.eval.batch_size
        ev = SubsetEvaluator(self.model, split, bs)
        full = ev(self.sensors)
        c = self.dataset.num_classes
        out: dict[str, Any] = {"accuracy": full.accuracy, "test_loss": full.loss}
        confusion = np.bincount(split.y * c + full.predictions, minlength=c * c).reshape(c, c)
        for ts in dict.fromkeys(self.tier_sensors):
            out[f"acc_tier/{subset_name(ts)}"] = ev(ts).accuracy
        if len(self.sensors) > 1:
            for m in self.sensors:
                out[f"acc_sensor/{m}"] = ev((m,)).accuracy
        out.update(robustness_metrics(ev, self.sensors, self.tier_sensors,
                                      self.dataset.num_classes, full.accuracy))
        if self.sc.eval.scope != "devices":  # the headline accuracy
            self._feedback(t, full.accuracy)
        release_pages(self._test_maps)   # a mapped test split's pages stay in the page cache
        return RoundRecord(out, confusion=confusion)

    def _feedback(self, t: int, accuracy: float) -> None:
        """Show the headline accuracy of round t's evaluation to the policies that learn from
        outcomes (`observe_evaluation`, e.g. TIDE's adaptive weights)."""
        fb = EvalFeedback(t, float(accuracy), self.bytes_up + self.bytes_down, self.sim_seconds)
        for policy in (self.policies.selector, self.policies.schedule, self.policies.aggregator):
            policy.observe_evaluation(fb)

    def eval_payload(self, t: int) -> Broadcast:
        """What hosts evaluate their devices with (`eval.scope: devices`): the model, and what
        the aggregator says evaluation needs besides (`eval_extras()`, e.g. prototypes)."""
        return self._broadcast(t, self.policies.aggregator.eval_extras())

    def device_metrics(self, parts: list[DeviceEval]) -> dict[str, Any]:
        out = device_metrics(parts, self.obs.tier, self.tier_sensors, self.sensors,
                             self._data_group)
        if self.sc.eval.scope == "devices":  # the headline accuracy (else: `evaluate`'s)
            self._feedback(self._round, out["accuracy"])
        return out

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The server's state between rounds; with the next round's plan (and its counts)
        when it was made ahead, so that a resumed run does not plan that round again."""
        planned = {} if self._planned is None else {
            "planned": plan_state(*self._planned), "last_counts": list(self._last_counts)}
        return {"params": {g: v.copy() for g, v in self.params.items()},
                "obs": self.obs.state_dict(), "aggregator": self.policies.aggregator.state_dict(),
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "sim_seconds": self.sim_seconds, "last_download": self.last_download.copy(),
                "frozen_sent": {g: v.copy() for g, v in self.frozen_sent.items()},
                **{k: policy.state_dict() for k, policy in self._stateful().items()},
                **({} if self.privacy is None else {"privacy": self.privacy.state_dict()}),
                **({} if self.clock is None else {"clock": self.clock.state_dict()}),
                **planned}

    def _stateful(self) -> dict[str, ServerPolicy]:
        """Selector and schedule when they keep state of their own (the aggregator's is always
        saved): what an adaptive policy has learned must survive a resume. A policy with the
        default `state_dict` adds no key, so checkpoints of stateless ones stay as they were."""
        pairs: tuple[tuple[str, ServerPolicy], ...] = (
            ("selector", self.policies.selector), ("schedule", self.policies.schedule))
        return {k: p for k, p in pairs if p.overrides(ServerPolicy.state_dict)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.params = {g: np.asarray(v, np.float32) for g, v in state["params"].items()}
        self.obs = Observations.from_state(state["obs"])
        self.policies.aggregator.load_state_dict(state["aggregator"])
        self.bytes_up, self.bytes_down = int(state["bytes_up"]), int(state["bytes_down"])
        self.sim_seconds = float(state["sim_seconds"])
        self.last_download = np.asarray(state["last_download"], np.int64).copy()
        self.frozen_sent = {g: np.asarray(v, bool).copy()
                            for g, v in state["frozen_sent"].items()}
        for k, policy in self._stateful().items():
            if k in state:
                policy.load_state_dict(state[k])
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])
        if self.clock is not None:
            self.clock.load_state_dict(state["clock"])
        self._planned = plan_from_state(state["planned"]) if "planned" in state else None
        if "last_counts" in state:
            online, eligible = state["last_counts"]
            self._last_counts = (int(online), int(eligible))
