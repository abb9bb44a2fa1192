"""Asynchronous aggregation on a simulated clock: FedBuff, FedAsync (docs/methods/async.md).

The rules, in simulated seconds:

- The server keeps C (`aggregator.concurrency`) devices in flight. Whenever slots are free it
  picks devices for them with the scenario's selector, among those available at that instant
  and not in flight (default: uniformly at random); each is sent the current model version.
- A device dispatched at time t finishes at t + compute + traffic seconds (its hardware
  profile: samples × epochs × FLOPs / speed, the groups' bytes over its bandwidths). If its
  availability interval ends before that, it fails at its departure: its work until then is
  wasted, its update lost, its local state unchanged (like a crash), and its slot frees then.
- Events (arrivals and failures) are taken in order of simulated time, ties by device id.
- Every M (`aggregator.buffer`) arrivals the aggregator takes one server step (`apply`): a new
  model version, one row of `rounds.parquet` (`round` counts versions). Staleness of an
  arrival = versions aggregated since its dispatch.
- Free slots are filled once per instant, after every event at that instant (and the server
  steps they complete): devices that arrive together are not sent a version their
  neighbours' updates are about to replace. With M = C, equal speeds and everyone online,
  every update is fresh and FedBuff runs FedAvg's rounds (docs/methods/async.md).
- Devices dispatched from the same version train together in one executor call (the hosts'
  lock-step or sequential training); the call is made lazily, when the first of them is
  needed or before the version changes. Which devices share a call never changes a number:
  each device's training depends only on its version, its id and the call's index.
- Nobody available: the server waits for the next device to come online.

The event queue, the in-flight table and the books (`AsyncBook`) are plain data, saved whole
in checkpoints (in-flight results, base versions, untrained dispatches, the clock), so a run
resumed mid-flight continues exactly. The server side runs in the driver process for every
executor; only training goes to the executor's hosts (`train_now`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from raymm import seeding
from raymm.config.schema import Scenario
from raymm.errors import RaymmError
from raymm.models.size import flops_per_sample
from raymm.population.availability import Availability
from raymm.protocol.asynchrony import Arrivals, AsyncAggregator
from raymm.protocol.messages import HostResult, RoundPlan
from raymm.protocol.record import RoundRecord
from raymm.protocol.seams import SelectionContext
from raymm.protocol.traffic import comm_seconds, compute_seconds, downlink_bytes
from raymm.server import divergence
from raymm.server.server import Server
from raymm.sim.engine import Executor, World, is_eval_round

#: the device id of a wake-up event (nobody was available; someone comes online then)
WAKE = -1
#: row columns (TensorBoard tags `async/...`)
PREFIX = "async/"


class Trains(Protocol):
    """What the asynchronous loop needs of an executor: train one batch now."""

    def train_now(self, plan: RoundPlan, broadcast: Any) -> list[HostResult]: ...


def is_async(world: World) -> bool:
    return bool(getattr(world.policies.aggregator, "asynchronous", False))


@dataclass
class Flight:
    """One device in flight."""

    base: int          # the version it was sent
    dispatched: float  # simulated second it was sent
    finish: float      # when its update would arrive
    depart: float      # when its availability interval ends
    down: int          # bytes it was sent
    up: int            # bytes it sends when it arrives

    @property
    def doomed(self) -> bool:
        return self.depart < self.finish

    @property
    def event(self) -> float:
        return self.depart if self.doomed else self.finish


@dataclass
class Result:
    """A trained device's update, kept until it arrives."""

    rows: dict[str, np.ndarray]
    loss: float
    samples: int
    seconds: float     # its simulated compute seconds (Observations)
    failed: bool       # it raised (or an injected crash): nothing arrives


@dataclass
class AsyncBook:
    """The asynchronous loop's whole state between two events: plain data (`state_dict`)."""

    clock: float = 0.0
    version: int = 0
    batches: int = 0         # executor calls made (each call's index seeds its training)
    decisions: int = 0       # dispatch decisions made (each one's index seeds its selection)
    flight: dict[int, Flight] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)     # in flight, not trained yet
    results: dict[int, Result] = field(default_factory=dict)
    buffer: list[tuple[int, int, Result]] = field(default_factory=list)  # (id, base, result)
    bases: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    wakes: list[float] = field(default_factory=list)
    #: [lo, hi): nobody's availability changes in between (`AsyncExecutor._online`)
    window: tuple[float, float] = (0.0, 0.0)
    # since the last server step
    since: dict[str, float] = field(default_factory=dict)
    dispatched: list[int] = field(default_factory=list)
    # over the run
    totals: dict[str, float] = field(default_factory=dict)
    stale_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_step_clock: float = 0.0

    def heap(self) -> list[tuple[float, int]]:
        """The event queue: (time, device id), the earliest first, ties by id."""
        h = [(f.event, d) for d, f in self.flight.items()] + [(w, WAKE) for w in self.wakes]
        heapq.heapify(h)
        return h

    def add(self, key: str, value: float) -> None:
        self.since[key] = self.since.get(key, 0.0) + value
        self.totals[key] = self.totals.get(key, 0.0) + value

    def prune(self) -> None:
        """Drop the model versions no in-flight or buffered update started from."""
        keep = {f.base for f in self.flight.values()} | {b for _, b, _ in self.buffer}
        keep.add(self.version)
        for v in [v for v in self.bases if v not in keep]:
            del self.bases[v]

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        ids = list(self.flight)
        fl = [self.flight[d] for d in ids]
        return {
            "clock": self.clock, "version": self.version, "batches": self.batches,
            "decisions": self.decisions, "last_step_clock": self.last_step_clock,
            "flight": {"ids": np.array(ids, np.int64),
                       "base": np.array([f.base for f in fl], np.int64),
                       "dispatched": np.array([f.dispatched for f in fl], np.float64),
                       "finish": np.array([f.finish for f in fl], np.float64),
                       "depart": np.array([f.depart for f in fl], np.float64),
                       "down": np.array([f.down for f in fl], np.int64),
                       "up": np.array([f.up for f in fl], np.int64)},
            "pending": np.array(sorted(self.pending), np.int64),
            "results": _results_state(list(self.results), list(self.results.values())),
            "buffer": {"base": np.array([b for _, b, _ in self.buffer], np.int64),
                       **_results_state([d for d, _, _ in self.buffer],
                                        [r for _, _, r in self.buffer])},
            "bases": {str(v): {g: x.copy() for g, x in p.items()} for v, p in self.bases.items()},
            "wakes": np.array(self.wakes, np.float64), "window": list(self.window),
            "since": dict(self.since), "totals": dict(self.totals),
            "dispatched": np.array(self.dispatched, np.int64),
            "stale_counts": self.stale_counts.copy()}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> AsyncBook:
        fl = s["flight"]
        flight = {int(d): Flight(int(b), float(t0), float(t1), float(t2), int(dn), int(up))
                  for d, b, t0, t1, t2, dn, up in zip(
                      fl["ids"], fl["base"], fl["dispatched"], fl["finish"], fl["depart"],
                      fl["down"], fl["up"])}
        r_ids, r_vals = _results_from(s["results"])
        b_ids, b_vals = _results_from(s["buffer"])
        return cls(
            clock=float(s["clock"]), version=int(s["version"]), batches=int(s["batches"]),
            decisions=int(s["decisions"]), flight=flight,
            pending={int(d) for d in s["pending"]}, results=dict(zip(r_ids, r_vals)),
            buffer=[(d, int(b), r) for d, b, r in zip(b_ids, s["buffer"]["base"], b_vals)],
            bases={int(v): {g: np.asarray(x, np.float32) for g, x in p.items()}
                   for v, p in s["bases"].items()},
            wakes=[float(w) for w in s["wakes"]],
            window=(float(s["window"][0]), float(s["window"][1])),
            since={k: float(v) for k, v in s["since"].items()},
            dispatched=[int(d) for d in s["dispatched"]],
            totals={k: float(v) for k, v in s["totals"].items()},
            stale_counts=np.asarray(s["stale_counts"], np.int64).copy(),
            last_step_clock=float(s["last_step_clock"]))


def _results_state(ids: list[int], res: list[Result]) -> dict[str, Any]:
    groups = sorted({g for r in res for g in r.rows})
    return {"ids": np.array(ids, np.int64), "loss": np.array([r.loss for r in res], np.float64),
            "samples": np.array([r.samples for r in res], np.int64),
            "seconds": np.array([r.seconds for r in res], np.float64),
            "failed": np.array([r.failed for r in res], bool),
            "has": {g: np.array([g in r.rows for r in res], bool) for g in groups},
            "rows": {g: np.stack([r.rows[g] for r in res if g in r.rows]) for g in groups}}


def _results_from(s: dict[str, Any]) -> tuple[list[int], list[Result]]:
    n = len(s["ids"])
    rows: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
    for g, has in s["has"].items():
        for i, row in zip(np.flatnonzero(has).tolist(), np.asarray(s["rows"][g])):
            rows[i][g] = np.asarray(row, np.float32)
    return [int(d) for d in s["ids"]], [
        Result(rows[i], float(s["loss"][i]), int(s["samples"][i]), float(s["seconds"][i]),
               bool(s["failed"][i])) for i in range(n)]


def results_of(hosts: list[HostResult]) -> dict[int, Result]:
    """Each trained (or failed) device's `Result` from the hosts' answers."""
    out: dict[int, Result] = {}
    for h in hosts:
        for i, d in enumerate(h.device_ids.tolist()):
            out[d] = Result({}, float(h.loss[i]), int(h.num_samples[i]),
                            float(h.compute_seconds[i]), False)
        for g, pos in h.senders.items():
            for p, row in zip(pos.tolist(), h.updates[g]):
                out[int(h.device_ids[p])].rows[g] = np.array(row, np.float32)
        for d in h.failed.tolist():
            out[int(d)] = Result({}, float("nan"), 0, 0.0, True)
    return out


def stack_arrivals(buffer: list[tuple[int, int, Result]], version: int,
                   bases: dict[int, dict[str, np.ndarray]]) -> Arrivals:
    """The buffered arrivals as the aggregator reads them (arrival order)."""
    groups = sorted({g for _, _, r in buffer for g in r.rows})
    trained, deltas, senders = {}, {}, {}
    for g in groups:
        pos = [i for i, (_, _, r) in enumerate(buffer) if g in r.rows]
        trained[g] = np.stack([buffer[i][2].rows[g] for i in pos])
        deltas[g] = trained[g] - np.stack([bases[buffer[i][1]][g] for i in pos])
        senders[g] = np.array(pos, np.int64)
    return Arrivals(np.array([d for d, _, _ in buffer], np.int64),
                    np.array([r.samples for _, _, r in buffer], np.int64),
                    np.array([version - b for _, b, _ in buffer], np.int64),
                    trained, deltas, senders)


class AsyncExecutor:
    """An executor for asynchronous runs: the event loop and the server in the driver, the
    training on `inner`'s hosts (serial or Ray). `drive` calls `run_rounds` instead of the
    engine's synchronous rounds; checkpoints hold the server's state and the `AsyncBook`."""

    def __init__(self, inner: Executor) -> None:
        if not hasattr(inner, "train_now"):
            raise RaymmError(f"the {inner.name} executor cannot run asynchronous aggregation")
        self.inner = inner
        self.trainer: Trains = inner  # type: ignore[assignment]  # checked just above
        self.name = inner.name
        self.tb: Any = None  # a TensorBoard writer (`run_rounds`): accuracy vs simulated time

    # --- set-up: the inner executor's hosts, a server in this process ----------------------
    def prestart(self, sc: Scenario) -> None:
        self.inner.prestart(sc)

    def start(self, world: World) -> None:
        self.inner.start(world)
        sc = self.sc = world.scenario
        self.world = world
        self.server = Server(sc, world.dataset, world.population, world.policies)
        agg = world.policies.aggregator
        if not isinstance(agg, AsyncAggregator):
            raise RaymmError(f"aggregation {sc.aggregation.name!r} is not asynchronous")
        self.agg = agg
        pop = world.population
        self.clock: Availability = pop.availability
        self.flops = flops_per_sample(self.server.model, world.dataset)
        self.in_flight = np.zeros(pop.n, bool)
        self.book = AsyncBook()
        self.book.bases[0] = self.server.params
        self.heap: list[tuple[float, int]] = []  # the event queue (`AsyncBook.heap`)
        self._cost_cache: dict[tuple[str, ...],
                               tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # the current availability window's devices (`_online`)
        self._avail: tuple[np.ndarray, int, np.ndarray] | None = None
        # those of them not in flight, kept up to date event by event (None: recompute)
        self._idle: np.ndarray | None = None

    def ready(self) -> None:
        self.inner.ready()

    # --- the synchronous steps do not apply ------------------------------------------------
    def _sync_only(self, *args: Any) -> Any:
        raise RaymmError("an asynchronous run has no synchronous rounds")

    poll = plan = train = aggregate = evaluate_devices = _sync_only

    def evaluate(self, t: int) -> RoundRecord:
        return self.server.evaluate(t)

    def get(self, value: Any) -> Any:
        return value

    def server_state(self) -> dict[str, Any]:
        return {**self.server.state_dict(), "async": self.book.state_dict()}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict({k: v for k, v in state.items() if k != "async"})
        self.book = AsyncBook.from_state(state["async"])
        self._avail = self._idle = None
        self.in_flight[:] = False
        self.in_flight[list(self.book.flight)] = True

    def host_states(self) -> dict[int, Any]:
        return self.inner.host_states()

    def load_host_states(self, state: dict[int, Any]) -> None:
        self.inner.load_host_states(state)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """summary.json's `async` entry (`async_summary`), with the staleness distribution."""
        return async_summary(rows, self.book.stale_counts)

    # --- the loop -------------------------------------------------------------------------
    def run_rounds(self, sc: Scenario, first: int,
                   on_round: Callable[[RoundRecord], bool | None], tb: Any = None) -> int:
        """Events until server version `sc.rounds` (or `on_round` says stop). Returns the
        last version reached."""
        self.tb = tb
        book = self.book
        if book.version == 0 and not book.flight and not book.wakes:
            self._refill()
        wall0 = time.perf_counter()
        self.heap = book.heap()
        while book.version < sc.rounds:
            if not self.heap:
                raise RaymmError("asynchronous run: nobody is in flight and nobody will come "
                                 "online again (the availability has no next interval)")
            at, dev = heapq.heappop(self.heap)
            book.clock = at
            if dev == WAKE:
                book.wakes.remove(at)
            else:
                self._event(dev)
            record = self._step() if len(book.buffer) >= self.agg.buffer else None
            if not self.heap or self.heap[0][0] > at:  # the instant's last event: refill
                self._refill()
            if record is not None:
                record.row[f"{PREFIX}in_flight"] = len(book.flight)
                if is_eval_round(book.version, sc) or self._eval_due(sc, record.row):
                    record.merge(self.server.evaluate(book.version))
                record.row["wall_seconds"] = time.perf_counter() - wall0
                wall0 = time.perf_counter()
                if on_round(record):
                    break
        return book.version

    @staticmethod
    def _eval_due(sc: Scenario, row: dict[str, Any]) -> bool:
        """Evaluation every T simulated seconds (`clock.eval_every_seconds`, where the
        scenario has it): the step took the clock past a multiple of T."""
        every = getattr(getattr(sc, "clock", None), "eval_every_seconds", None)
        if not every:
            return False
        end = float(row["sim_seconds_total"])
        return int(end // every) > int((end - float(row["sim_seconds"])) // every)

    def _event(self, dev: int) -> None:
        """Device `dev`'s update arrives, or it leaves before it could finish."""
        book = self.book
        f = book.flight.pop(dev)
        self.in_flight[dev] = False
        self._back_to_idle(dev)
        if f.doomed:  # left at f.depart: the work so far is wasted, nothing is uploaded
            book.add("departed", 1)
            book.add("wasted_seconds", f.depart - f.dispatched)
            book.add("device_seconds", f.depart - f.dispatched)
            return
        if dev in book.pending:
            self._flush()
        r = book.results.pop(dev)
        book.add("device_seconds", f.finish - f.dispatched)
        if r.failed:
            book.add("crashed", 1)
            book.add("wasted_seconds", f.finish - f.dispatched)
            return
        book.add("arrivals", 1)
        book.add("bytes_up", f.up)
        self.server.obs.observe_trained(np.array([dev], np.int64), np.array([r.seconds]))
        book.buffer.append((dev, f.base, r))

    def _flush(self) -> None:
        """Train every device dispatched from the current version and not trained yet, in one
        executor call."""
        book = self.book
        if not book.pending:
            return
        book.batches += 1
        ids = np.array(sorted(book.pending), np.int64)
        t = book.batches
        sched = self.server.policies.schedule
        plan = RoundPlan(t, ids, sched.active_groups(book.version + 1, self.server.layout.groups))
        bcast = self.server._broadcast(t, self.server._extras(t))
        book.results.update(results_of(self.trainer.train_now(plan, bcast)))
        book.pending = set()

    def _step(self) -> RoundRecord:
        """One server step on the buffered arrivals: the next model version and its row."""
        book, server = self.book, self.server
        self._flush()  # whoever was sent this version trains from it before it changes
        arrivals = stack_arrivals(book.buffer, book.version, book.bases)
        merged = self.agg.apply(server.params, arrivals)
        loss = np.array([r.loss for _, _, r in book.buffer])
        bad = divergence.diverged(arrivals.device_ids, loss, merged)
        if bad is None:
            server.params = merged
        book.version += 1
        book.bases[book.version] = server.params
        book.buffer = []
        book.prune()
        counts = np.bincount(arrivals.staleness)
        book.stale_counts = np.pad(book.stale_counts, (0, max(0, counts.size
                                                              - book.stale_counts.size)))
        book.stale_counts[:counts.size] += counts
        return self._record(arrivals, loss, bad)

    def _record(self, arrivals: Arrivals, loss: np.ndarray, bad: list[int] | None
                ) -> RoundRecord:
        book, server = self.book, self.server
        v, since, totals = book.version, book.since, book.totals
        server.bytes_down += int(since.get("bytes_down", 0))
        server.bytes_up += int(since.get("bytes_up", 0))
        server.sim_seconds = book.clock
        server._round = v
        s = arrivals.staleness
        w = arrivals.num_samples.astype(np.float64)
        online_ids = np.flatnonzero(self.clock.available(book.clock))
        online = int(online_ids.size)
        server.obs.observe_online(online_ids,
                                  self.world.population.num_samples[online_ids].astype(np.int64))
        if self.tb is not None:
            self.tb.add_histogram("async/staleness", s, v)
        spent = totals.get("device_seconds", 0.0)
        dispatched = np.unique(np.array(book.dispatched, np.int64))
        row = {
            "round": v, "phase": server.policies.schedule.phase(v), "online": online,
            "selected": int(since.get("dispatched", 0)), "participated": arrivals.n,
            "failed": int(since.get("crashed", 0)),
            "bytes_down": int(since.get("bytes_down", 0)),
            "bytes_up": int(since.get("bytes_up", 0)),
            "bytes_total": server.bytes_up + server.bytes_down,
            "sim_seconds": book.clock - book.last_step_clock, "sim_seconds_total": book.clock,
            "train_loss": float(np.average(loss, weights=w)) if w.sum() > 0 else float("nan"),
            # the seconds clock's columns (docs/time.md), over the interval since the last step
            "sim_start_seconds": book.last_step_clock, "idle_seconds": 0.0,
            "departed": int(since.get("departed", 0)),
            "work_seconds": float(since.get("device_seconds", 0.0)),
            "wasted_seconds": float(since.get("wasted_seconds", 0.0)),
            "work_seconds_total": spent,
            "wasted_seconds_total": totals.get("wasted_seconds", 0.0),
            "wasted_share": totals.get("wasted_seconds", 0.0) / spent if spent else 0.0,
            f"{PREFIX}in_flight": len(book.flight),
            f"{PREFIX}staleness_mean": float(s.mean()),
            f"{PREFIX}staleness_max": int(s.max()),
            f"{PREFIX}staleness_p90": float(np.quantile(s, 0.9)),
            f"{PREFIX}arrivals_total": int(totals.get("arrivals", 0)),
            **dict(server.policies.selector.round_stats()),
        }
        book.since, book.dispatched = {}, []
        book.last_step_clock = book.clock
        return RoundRecord(row, selected=dispatched, diverged=bad)

    def _refill(self) -> None:
        """Fill the free slots at the current instant with the current version."""
        book, server = self.book, self.server
        free = self.agg.concurrency - len(book.flight)
        if free <= 0:
            return
        t = book.clock
        online, allowed = self._online(t)
        if self._idle is None:
            self._idle = allowed[~self.in_flight[allowed]]
        eligible = self._idle
        book.decisions += 1
        chosen = np.zeros(0, np.int64)
        if eligible.size:
            rng = seeding.rng(self.sc.seed, book.decisions, seeding.SERVER, "async_selection")
            ctx = SelectionContext(book.version + 1, online, eligible, free, server.obs, rng)
            chosen = np.sort(np.asarray(server.policies.selector.select(ctx), np.int64))
            pos = np.minimum(np.searchsorted(allowed, chosen), allowed.size - 1)
            if chosen.size > free or np.any(allowed[pos] != chosen) \
                    or self.in_flight[chosen].any() or np.any(chosen[1:] == chosen[:-1]):
                raise RuntimeError("selection policy returned devices that are not eligible, "
                                   "repeated, or more than the free slots")
        if chosen.size < free and not book.wakes and np.isfinite(book.window[1]):
            # look again when availability next changes (someone may come online then)
            book.wakes.append(book.window[1])
            heapq.heappush(self.heap, (book.window[1], WAKE))
        if chosen.size == 0:
            return
        self._dispatch(chosen)

    def _online(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(devices available at t, those of them the schedule lets take part now), sorted.
        Availability changes only where an interval starts or ends: the set is computed once
        per window [lo, hi) between two such instants (the window is in the checkpoint, so a
        resumed run reads availability at the same instants)."""
        book, server = self.book, self.server
        lo, hi = book.window
        if self._avail is None or not lo <= t < hi:
            if not lo <= t < hi:  # a new window from t to the next change
                avail = self.clock.available(t)
                ids = np.arange(avail.shape[0])
                ends = self.clock.departure(t, ids[avail])
                starts = self.clock.next_arrival(t, ids[~avail])
                hi = float(min(ends.min(initial=np.inf), starts.min(initial=np.inf)))
                if hi <= t:  # an arrival a rounding error short of its interval: look later
                    hi = t + 1e-6 * max(1.0, abs(t))
                book.window = lo, hi = t, hi
            online = np.flatnonzero(self.clock.available(lo))
            self._avail, self._idle = (online, -1, online), None
        online, version, allowed = self._avail
        if version != book.version:  # the schedule decides per version
            sched = server.policies.schedule
            allowed = online[sched.eligible(book.version + 1, server.obs.sensor_mask[online],
                                            server.sensors)]
            self._avail, self._idle = (online, book.version, allowed), None
        return online, allowed

    def _costs(self, active: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every device's bytes down, bytes up and simulated seconds (compute + traffic) for
        the groups `active`: computed once for all devices per set of groups, read per
        dispatch (elementwise, so the same numbers as computed for a few)."""
        hit = self._cost_cache.get(active)
        if hit is None:
            pop, sc, layout = self.world.population, self.sc, self.server.layout
            mask = pop.sensor_mask
            down = downlink_bytes(mask, pop.sensors, active, sc.training.upload, layout.sizes,
                                  4 * sc.model.embed_dim)
            up = downlink_bytes(mask, pop.sensors, active, sc.training.upload, layout.sizes) \
                if active else np.zeros(pop.n, np.int64)
            seconds = compute_seconds(pop.num_samples, sc.training.local_epochs, self.flops,
                                      pop.gflops) + comm_seconds(down, up, pop.down_bps,
                                                                 pop.up_bps)
            if len(self._cost_cache) > 8:  # schedules change active groups: keep it bounded
                self._cost_cache.clear()
            hit = self._cost_cache[active] = (down, up, seconds)
        return hit

    def _back_to_idle(self, dev: int) -> None:
        """Device `dev` left flight: eligible again if the current window allows it."""
        if self._idle is None or self._avail is None:
            return
        allowed = self._avail[2]
        p = int(np.searchsorted(allowed, dev))
        if p < allowed.size and allowed[p] == dev:
            self._idle = np.insert(self._idle, int(np.searchsorted(self._idle, dev)), dev)

    def _dispatch(self, ids: np.ndarray) -> None:
        book, server = self.book, self.server
        t = book.clock
        active = server.policies.schedule.active_groups(book.version + 1, server.layout.groups)
        down_all, up_all, seconds_all = self._costs(tuple(active))
        down, up, seconds = down_all[ids], up_all[ids], seconds_all[ids]
        depart = self.clock.departure(t, ids)
        server.obs.observe_selected(book.version + 1, ids)
        for d, s, dp, dn, u in zip(ids.tolist(), seconds.tolist(), depart.tolist(),
                                    down.tolist(), up.tolist()):
            f = Flight(book.version, t, t + s, dp, dn, u)
            book.flight[d] = f
            heapq.heappush(self.heap, (f.event, d))
            if not f.doomed:
                book.pending.add(d)
        self.in_flight[ids] = True
        if self._idle is not None:  # `ids` are sorted, eligible, hence in `_idle`
            self._idle = np.delete(self._idle, np.searchsorted(self._idle, ids))
        book.dispatched.extend(ids.tolist())
        book.add("dispatched", ids.size)
        book.add("bytes_down", float(down.sum()))


def async_summary(rows: list[dict[str, Any]], stale_counts: np.ndarray | None = None
                  ) -> dict[str, Any]:
    """summary.json's `async` entry from the rows of an asynchronous run (empty otherwise):
    staleness (its distribution: arrivals per staleness 0, 1, ...), wasted share, arrivals.
    Accuracy against simulated hours and the time to a target are the seconds clock's
    (`summary.time_summary`)."""
    steps = [r for r in rows if f"{PREFIX}arrivals_total" in r]
    if not steps:
        return {}
    last = steps[-1]
    hist = {} if stale_counts is None else {"staleness_counts": stale_counts.tolist()}
    return {"async": {
        "arrivals": last[f"{PREFIX}arrivals_total"],
        "wasted_share": last["wasted_share"],
        "staleness_mean": float(np.mean([r[f"{PREFIX}staleness_mean"] for r in steps])),
        "staleness_max": int(max(r[f"{PREFIX}staleness_max"] for r in steps)),
        "sim_seconds_per_step": float(np.mean([r["sim_seconds"] for r in steps])),
        **hist}}
