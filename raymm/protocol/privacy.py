"""The device's half of differential privacy: clip one device's update (and, in local mode,
noise it) before it leaves; plus the few facts both halves share (docs/methods/privacy.md).

A device's update is the change of each group it sends: its trained vector minus the vector it
started from (`training.exchange: params`), or the delta it already sends (`delta`). Clipping
happens here, per device, before a host pre-sums whole id blocks (`raymm.protocol.combine`), so
no block's sum can hold a contribution larger than C. The server's half (noise on the sum, the
fixed denominator, adaptive C and the accountant) is `raymm.server.privacy`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np

from raymm import seeding
from raymm.config.schema import PrivacySpec, Scenario
from raymm.errors import ScenarioError

#: broadcast extra: float64 [1], the round's clip bound C (adaptive clipping moves it)
CLIP = "privacy/clip"
#: broadcast extra: float64 [1], local mode's σ (solved by the server's ledger when the scenario
#: gives a target ε): the one value every device noises with
NOISE = "privacy/noise_multiplier"
#: device extra: float32, 1.0 when the device's update was within C before clipping (the bit
#: whose noised mean adaptive clipping follows; sent only under adaptive clipping, which is
#: central mode's: under local DP the bit would leave the device in the clear)
UNCLIPPED = "privacy/unclipped"
#: where the selection's secret seed may come from when the scenario does not give it
SECRET_ENV = "RAYMM_SELECTION_SECRET"
#: a scaled row is shrunk by this much more, so that its float32 copy is within C too
#: (float32 rounds each coordinate by at most 2^-24 relative: 6e-8 on the norm)
MARGIN = 1.0 - 1e-6


def group_bounds(clip: float, sizes: Mapping[str, int], split: str) -> dict[str, float]:
    """C_g per group for `clip_unit: group`: C_g = C·sqrt(s_g) with Σ s_g = 1 over `sizes`
    (by parameter count, or equally), so that Σ C_g² = C² and a device's whole update stays
    within C whatever groups it sends."""
    total = float(sum(sizes.values()))
    share = {g: (n / total if split == "size" else 1.0 / len(sizes)) for g, n in sizes.items()}
    return {g: clip * math.sqrt(s) for g, s in share.items()}


def clip_update(update: Mapping[str, np.ndarray], clip: float | None,
                bounds: Mapping[str, float] | None = None
                ) -> tuple[dict[str, np.ndarray], float, bool]:
    """(the update with L2 norm at most `clip` as float32, its norm before clipping, whether it
    was within `clip`). `bounds` (per group) clips each group to its own C_g instead of the
    whole update to C; `clip` None clips nothing."""
    x = {g: np.asarray(v, np.float64) for g, v in update.items()}
    norm = math.sqrt(sum(float(np.dot(v, v)) for v in x.values()))
    if clip is None:
        return {g: v.astype(np.float32) for g, v in x.items()}, norm, True
    out = {}
    for g, v in x.items():
        if bounds is None:
            c, n = clip, norm
        else:
            c, n = bounds[g] * clip, float(np.linalg.norm(v))  # bounds are for C = 1
        scale = 1.0 if n <= c else MARGIN * c / n
        out[g] = (v * scale).astype(np.float32)
    return out, norm, norm <= clip


def local_noise(seed: int, rnd: int, device: int, update: Mapping[str, np.ndarray],
                std: float) -> dict[str, np.ndarray]:
    """`update` plus N(0, std²) per coordinate, drawn from the device's stream
    (seed, round, device, "privacy/local") group by group in sorted order."""
    gen = seeding.rng(seed, rnd, device, "privacy/local")
    return {g: (np.asarray(update[g], np.float64) + gen.normal(0.0, std, update[g].shape)
                ).astype(np.float32) for g in sorted(update)}


def privatize(spec: PrivacySpec, seed: int, rnd: int, device: int,
              sent: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray] | None,
              clip: float | None, bounds: Mapping[str, float] | None,
              sigma: float | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(what the device uploads instead of `sent`, its privacy extras). The upload is always
    the clipped change: `sent` minus `start` when it sent parameters (`start` not None), `sent`
    itself when it sent deltas; in local mode with its own noise of σ·C added, σ the server's
    (`NOISE`, a solved σ) or else the scenario's. The only extra is adaptive clipping's bit."""
    update = sent if start is None else {
        g: np.asarray(v, np.float64) - np.asarray(start[g], np.float64) for g, v in sent.items()}
    clipped, _, within = clip_update(update, clip, bounds)
    if spec.mode == "local" and clip is not None:
        sigma = spec.noise_multiplier if sigma is None else sigma
        if sigma is None:  # never upload a local-DP update without its noise
            raise ValueError("privacy: local mode, but no noise multiplier reached the device")
        if sigma > 0:
            clipped = local_noise(seed, rnd, device, clipped, sigma * clip)
    extras = {UNCLIPPED: np.array(1.0 if within else 0.0, np.float32)} \
        if spec.adaptive_clip else {}
    return clipped, extras


def round_clip(spec: PrivacySpec, extras: Mapping[str, np.ndarray]) -> float | None:
    """The round's clip bound C: the server's in the broadcast `extras` (adaptive clipping
    moves it), else the scenario's."""
    c = extras.get(CLIP)
    return float(c[0]) if c is not None else spec.clip


def round_noise(extras: Mapping[str, np.ndarray]) -> float | None:
    """Local mode's σ as the server broadcast it (None: the scenario's own)."""
    s = extras.get(NOISE)
    return float(s[0]) if s is not None else None


def with_selection_secret(sc: Scenario) -> Scenario:
    """`sc` with `privacy.selection_secret` read from RAYMM_SELECTION_SECRET when the
    scenario has none (the field is never written to config.yaml)."""
    raw = os.environ.get(SECRET_ENV, "").strip()
    if not sc.privacy.on or sc.privacy.selection_secret is not None or not raw:
        return sc
    if not raw.isdigit():  # digits only: a non-negative integer
        raise ScenarioError([f"{SECRET_ENV} must be a non-negative integer (got {raw!r})"])
    secret = int(raw)
    return sc.model_copy(update={"privacy": sc.privacy.model_copy(
        update={"selection_secret": secret})})
