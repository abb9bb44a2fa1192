"""Pictures of a run: partitions, availability, learning curves, confusion matrices.

Each function returns a matplotlib `Figure` drawn on its own Agg canvas: no pyplot, no display,
and the caller's backend is left as it was (a notebook keeps its inline or widget backend).
`to_image` turns a figure into an `[H, W, 3]` uint8 array for TensorBoard, `save_png` writes it
to a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

MAX_ROWS = 200  # devices drawn in per-device pictures; more would not be readable


def _figure(width: float, height: float) -> Figure:
    """A figure with an Agg canvas of its own, known to no backend and no pyplot state."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def to_image(fig: Figure) -> np.ndarray:
    canvas = fig.canvas
    if not isinstance(canvas, FigureCanvasAgg):  # a figure drawn elsewhere: render it with Agg
        canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_png(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight")


def _rows_note(n: int) -> str:
    return f" (first {MAX_ROWS} of {n} devices)" if n > MAX_ROWS else ""


def label_heatmap(counts: np.ndarray, class_names: Sequence[str]) -> Figure:
    """Devices × classes sample counts: the label skew of the partition."""
    n = counts.shape[0]
    shown = counts[:MAX_ROWS]
    fig = _figure(6, 4.5)
    ax = fig.subplots()
    im = ax.imshow(shown, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("device")
    ax.set_xticks(range(counts.shape[1]))
    ax.set_xticklabels([str(c)[:10] for c in class_names]
                       or [str(c) for c in range(counts.shape[1])],
                       rotation=45, ha="right", fontsize=7)
    ax.set_title("Training samples per device and class" + _rows_note(n), fontsize=9)
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    return fig


def sensor_matrix(mask: np.ndarray, sensors: Sequence[str], tier_names: Sequence[str],
                  tier: np.ndarray) -> Figure:
    """Devices × sensors: which device holds which sensor, devices grouped by tier."""
    order = np.argsort(tier, kind="stable")[:MAX_ROWS]
    fig = _figure(4 + 0.4 * len(sensors), 4.5)
    ax = fig.subplots()
    ax.imshow(mask[order].astype(float), aspect="auto", cmap="Greens", vmin=0, vmax=1,
              interpolation="nearest")
    ax.set_xticks(range(len(sensors)))
    ax.set_xticklabels(sensors)
    ax.set_ylabel("device (grouped by tier)")
    counts = np.bincount(tier, minlength=len(tier_names))
    ax.set_title("Sensors held" + _rows_note(mask.shape[0]) + "\n" +
                 ", ".join(f"{t}: {c}" for t, c in zip(tier_names, counts)), fontsize=8)
    fig.tight_layout()
    return fig


def availability_timeline(online: np.ndarray, selected: np.ndarray | None = None) -> Figure:
    """Devices × rounds: 0 offline, 1 online, 2 selected."""
    grid = online[:MAX_ROWS].astype(np.int8)
    if selected is not None:
        grid = grid + selected[:MAX_ROWS].astype(np.int8)
    fig = _figure(7, 4.5)
    ax = fig.subplots()
    cmap = ListedColormap(["#f0f0f0", "#9ecae1", "#d62728"])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=2, interpolation="nearest",
              extent=(0.5, grid.shape[1] + 0.5, grid.shape[0] - 0.5, -0.5))  # rounds from 1
    ax.set_xlabel("round")
    ax.set_ylabel("device")
    what = "online (blue) and selected (red)" if selected is not None else "online (blue)"
    ax.set_title(f"Availability: {what}" + _rows_note(online.shape[0]), fontsize=9)
    fig.tight_layout()
    return fig


def accuracy_vs_traffic(curves: dict[str, tuple[np.ndarray, np.ndarray]],
                        budget_gib: float | None = None) -> Figure:
    """Test accuracy against cumulative communication (GiB), one curve per run."""
    fig = _figure(6, 4)
    ax = fig.subplots()
    cmap = colormaps["tab20" if len(curves) > 10 else "tab10"]
    colors = [cmap(i) for i in range(cmap.N)]   # its 10 or 20 colours
    styles = ["-", "--", ":", "-."]
    for i, (name, (gib, acc)) in enumerate(curves.items()):
        ax.plot(gib, acc, marker=".", label=name, color=colors[i % len(colors)],
                linestyle=styles[(i // len(colors)) % len(styles)])
    if budget_gib is not None:
        ax.axvline(budget_gib, color="k", linestyle=":", label=f"budget B = {budget_gib:g} GiB")
        ax.axvline(budget_gib / 2, color="grey", linestyle=":", label="B/2")
    return _accuracy_axes(fig, ax, "cumulative communication (GiB)")


def accuracy_vs_sim_hours(curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> Figure:
    """Test accuracy against simulated hours (the clock of docs/time.md), one curve per run."""
    fig = _figure(6, 4)
    ax = fig.subplots()
    cmap = colormaps["tab20" if len(curves) > 10 else "tab10"]
    for i, (name, (hours, acc)) in enumerate(curves.items()):
        ax.plot(hours, acc, marker=".", label=name, color=cmap(i % cmap.N))
    return _accuracy_axes(fig, ax, "simulated time (hours)")


def _accuracy_axes(fig: Figure, ax: Axes, xlabel: str) -> Figure:
    """The accuracy curves' common finish: labels, grid, legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def confusion(matrix: np.ndarray, class_names: Sequence[str]) -> Figure:
    """Row-normalised confusion matrix (true class × predicted class)."""
    m = matrix.astype(float)
    norm = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    fig = _figure(5, 4.5)
    ax = fig.subplots()
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    names = [str(c)[:10] for c in class_names] or [str(i) for i in range(m.shape[0])]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig
