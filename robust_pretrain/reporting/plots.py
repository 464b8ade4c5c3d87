"""Every figure a run writes, with one colour rule per modality.

* RGB: the processed (normalised) image mapped back to [0, 1] with the processor's mean and std.
* depth: metres on ``viridis``, the scale spanning the target's valid pixels; invalid pixels (depth <= 0 or NaN) white.
* class maps (semseg): class id ``i`` is always ``tab20`` colour ``i mod 20``, whatever the number of classes or the
  figure; ignored pixels white.

Figures: the task-weight trajectories of a pre-training run (``task_weights.png``), MM-MAE reconstructions
(``reconstructions.png``), dense fine-tuning predictions (``predictions.png``) and the comparison of strategies
(``comparison_tasks.png``, ``frontier.png``). matplotlib (and torch, for the reconstructions) load on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robust_pretrain.reporting.scoring import METRIC_LABELS

if TYPE_CHECKING:
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

CLASS_COLOURS = "tab20"  # class id i -> colour i mod 20 of this qualitative map
DEPTH_COLOURS = "viridis"
INVALID_COLOUR = "white"  # invalid depth, ignored classes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: str | Path, dpi: int) -> Path:
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return Path(path)


# ------------------------------------------------------------------------------------------------- colour rules


def rgb_image(normalised: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """A processed image (3, H, W) as matplotlib draws it: (H, W, 3) in [0, 1]."""
    mean_, std_ = np.asarray(mean, dtype=float)[:, None, None], np.asarray(std, dtype=float)[:, None, None]
    return np.clip(np.asarray(normalised, dtype=float) * std_ + mean_, 0, 1).transpose(1, 2, 0)


def class_colour(class_id: int) -> tuple[float, float, float, float]:
    """The colour of a class id in every figure."""
    return _pyplot().get_cmap(CLASS_COLOURS)(class_id % 20)


def class_colormap(num_classes: int) -> Colormap:
    """One entry per class id (:func:`class_colour`), white for ignored (NaN or masked) pixels."""
    from matplotlib.colors import ListedColormap

    colours = [class_colour(i) for i in range(max(num_classes, 1))]
    return ListedColormap(colours, name="class_ids").with_extremes(bad=INVALID_COLOUR)


def class_map_style(num_classes: int) -> dict[str, Any]:
    """``imshow`` options of a class map (ids as float, ignored pixels NaN or masked)."""
    return {"cmap": class_colormap(num_classes), "vmin": -0.5, "vmax": num_classes - 0.5, "interpolation": "nearest"}


def depth_style(target: np.ndarray) -> dict[str, Any]:
    """``imshow`` options of a depth map in metres: the colour scale spans the target's valid (> 0, finite) pixels."""
    target = np.asarray(target, dtype=float)
    valid = target[np.isfinite(target) & (target > 0)]
    low, high = (float(valid.min()), float(valid.max())) if valid.size else (0.0, 1.0)
    cmap = _pyplot().get_cmap(DEPTH_COLOURS).with_extremes(bad=INVALID_COLOUR)
    return {"cmap": cmap, "vmin": low, "vmax": high}


def invalid_depth_as_nan(depth: np.ndarray) -> np.ndarray:
    depth = np.asarray(depth, dtype=float)
    return np.where(depth > 0, depth, np.nan)


def ignored_as_nan(class_ids: np.ndarray, ignore_index: int) -> np.ndarray:
    class_ids = np.asarray(class_ids, dtype=float)
    return np.where(class_ids == ignore_index, np.nan, class_ids)


def class_legend(label_names: Sequence[str]) -> list[Any]:
    """Legend handles: one patch per class, in its colour."""
    from matplotlib.patches import Patch

    return [Patch(color=class_colour(i), label=name) for i, name in enumerate(label_names)]


# --------------------------------------------------------------------------------------------- pre-training runs


MAX_LEGEND_TASKS = 20  # more tasks: lines without a legend (it would cover the panel)


def plot_task_trajectories(task_names: list[str], log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """Two panels over optimizer steps, each task's weight and each task's training loss, saved as a PNG."""
    return _save(trajectory_figure(task_names, log_history), path, dpi=110)


def trajectory_figure(task_names: list[str], log_history: list[dict[str, Any]]) -> Figure:
    """The figure of :func:`plot_task_trajectories`. A panel with no logged values says so instead of staying empty;
    points are marked, so that a single logged step shows; a legend names up to ``MAX_LEGEND_TASKS`` tasks."""
    plt = _pyplot()
    fig, (ax_w, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    train_steps = max((entry.get("step", 0) for entry in log_history), default=0)
    for ax, prefix, what in ((ax_w, "task_weight", "task weights"), (ax_l, "task_loss", "task losses")):
        for i, name in enumerate(task_names):
            key = f"{prefix}/{name}"
            points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=name, color=colors(i % 10), marker="o", markersize=3)
        if not ax.lines:
            message = f"nothing to draw: no {what} were logged"
            if not any("loss" in entry for entry in log_history):  # no training step was logged at all
                message += f"\n(the run's {train_steps} steps ended before its first logging step;\n"
                message += "lower logging_steps to see them)"
            ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax_w.set(title="task weight", xlabel="optimizer step", ylabel="weight")
    ax_l.set(title="task training loss (mean over each logging window)", xlabel="optimizer step", ylabel="loss")
    if ax_l.lines and len(task_names) <= MAX_LEGEND_TASKS:
        ax_l.legend(loc="upper right", fontsize=8, ncol=2)
    return fig


def _modality_image(kind: str, values: Any, processor: Any, ignore_index: int, target: bool) -> np.ndarray:
    """One modality of one image (a tensor: RGB (3,H,W), depth (1,H,W), class map (H,W) or logits (C,H,W)) as
    matplotlib draws it; a target's invalid depth and ignored classes are NaN."""
    array = values.detach().cpu().float().numpy()
    if kind == "rgb":
        return rgb_image(array, processor.image_mean, processor.image_std)
    if kind == "depth":
        return invalid_depth_as_nan(array[0]) if target else array[0]
    ids = array.argmax(0) if array.ndim == 3 else array
    return ignored_as_nan(ids, ignore_index) if target else ids


def _modality_style(spec: Any, target: np.ndarray) -> dict[str, Any]:
    if spec.kind == "depth":
        return depth_style(target)
    if spec.kind == "semseg":
        return class_map_style(spec.num_classes)
    return {}


def plot_reconstructions(model: Any, batch: dict[str, Any], ids: list[str], processor: Any, path: Path) -> Path:
    """Per held-out image, one row per modality of an MM-MAE: the image's RGB input (first row), the modality's masked
    input (hidden patches grey), the prediction, the prediction with the visible patches pasted in, and the target;
    each row names the image's loss on the hidden patches. Colours follow the module's rules."""
    import torch

    plt = _pyplot()
    config = model.config
    present = [spec for spec in config.modalities if spec.name in batch]
    context = next((spec for spec in present if spec.kind == "rgb"), present[0])
    model.eval()
    with torch.no_grad():
        outputs = [model(**{k: v[i : i + 1] for k, v in batch.items()}) for i in range(len(ids))]
    rows = [(i, spec) for i in range(len(ids)) for spec in present]
    titles = ("input", "masked input", "prediction", "prediction + visible", "target")
    fig, axes = plt.subplots(
        len(rows), len(titles), figsize=(1.75 * len(titles), 1.75 * len(rows) + 0.5), squeeze=False
    )
    patch, grid_width = config.patch_size, batch[present[0].name].shape[-1] // config.patch_size
    for r, (i, spec) in enumerate(rows):
        target = _modality_image(spec.kind, batch[spec.name][i], processor, spec.ignore_index, target=True)
        prediction = _modality_image(
            spec.kind, outputs[i].predictions[spec.name][0], processor, spec.ignore_index, target=False
        )
        hidden = batch[f"mask_{spec.name}"][i].numpy()
        pixels = np.kron(hidden.reshape(-1, grid_width), np.ones((patch, patch))).astype(bool)
        pasted = np.where(pixels[..., None] if target.ndim == 3 else pixels, prediction, target)
        style = _modality_style(spec, target)
        for c, image in enumerate((None, target, prediction, pasted, target)):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                if spec is present[0]:
                    shown = _modality_image(
                        context.kind, batch[context.name][i], processor, context.ignore_index, target=True
                    )
                    ax.imshow(shown, **_modality_style(context, shown))
                    ax.set_ylabel(ids[i], fontsize=8)
                else:
                    ax.axis("off")
                continue
            ax.imshow(image, **style)
            if c == 1:
                ax.imshow(np.where(pixels[..., None], (0.55, 0.55, 0.55, 1.0), (0.0, 0.0, 0.0, 0.0)))  # grey: hidden
                ax.set_ylabel(spec.name, fontsize=9)
                ax.set_xlabel(f"{int((~hidden).sum())}/{hidden.size} patches visible", fontsize=7)
            if c == 2:
                ax.set_xlabel(f"hidden-patch loss {float(outputs[i].task_losses[spec.name]):.3f}", fontsize=7)
    for ax, title in zip(axes[0], titles, strict=True):
        ax.set_title(title, fontsize=9)
    fig.suptitle("Held-out reconstructions (fixed evaluation masks)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    return _save(fig, path, dpi=100)


# ------------------------------------------------------------------------------------------------- fine-tuning


def plot_predictions(
    task: str,
    images: np.ndarray,
    predictions: np.ndarray,
    labels: np.ndarray,
    processor: Any,
    label_names: list[str] | None,
    ignore_index: int,
    path: Path,
) -> Path:
    """``predictions.png`` of dense fine-tuning: one row per image: input, prediction, target (classification: the
    input titled with both class names). ``images`` are processed (normalised) RGB arrays (N, 3, H, W)."""
    plt = _pyplot()
    columns = 1 if task == "classification" else 3
    figure, axes = plt.subplots(len(images), columns, figsize=(2.6 * columns, 2.6 * len(images)), squeeze=False)
    for row, image in enumerate(images):
        axes[row, 0].imshow(rgb_image(image, processor.image_mean, processor.image_std))
        if task == "classification":
            predicted, target = label_names[int(predictions[row].argmax())], label_names[int(labels[row])]
            axes[row, 0].set_title(f"prediction: {predicted}\ntarget: {target}", fontsize=9)
        else:
            axes[row, 0].set_title("input" if row == 0 else "", fontsize=9)
            if task == "semseg":
                shown = [ignored_as_nan(predictions[row], ignore_index), ignored_as_nan(labels[row], ignore_index)]
                style = class_map_style(len(label_names))
            else:
                shown = [predictions[row], invalid_depth_as_nan(labels[row])]
                style = depth_style(labels[row])
            for column, (values, title) in enumerate(zip(shown, ("prediction", "target"), strict=True), start=1):
                drawn = axes[row, column].imshow(values, **style)
                axes[row, column].set_title(title if row == 0 else "", fontsize=9)
            if task == "depth":
                figure.colorbar(drawn, ax=axes[row, 2], fraction=0.046, pad=0.04, label="metres")
        for axis in axes[row]:
            axis.axis("off")
    if task == "semseg":  # one colour per class; ignored pixels are white
        handles = class_legend(label_names)
        figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
        figure.tight_layout(rect=(0, 0.03 * (1 + len(handles) // 5), 1, 1))
    else:
        figure.tight_layout()
    return _save(figure, path, dpi=100)


# ------------------------------------------------------------------------------------------ strategy comparison


def plot_comparison(scores: dict[str, dict[str, Any]], output_dir: Path, frontier: bool) -> None:
    """Figures of a comparison of strategies, one panel per scale-free metric in ``scores``
    (:func:`~robust_pretrain.reporting.scoring.aggregate_scores`: raw, excess, regret):
    ``comparison_tasks.png`` (per-task, mean and worst value per run, error bars: std over seeds) and, with
    ``frontier``, ``frontier.png`` (:func:`frontier_figure`)."""
    plt = _pyplot()
    metrics = list(scores)
    runs = list(scores[metrics[0]])
    tasks = list(scores[metrics[0]][runs[0]]["tasks"])
    columns = [*tasks, "mean", "worst"]
    width = 0.8 / len(runs)
    fig, axes = plt.subplots(
        len(metrics), 1, figsize=(max(8, 1.1 * len(columns)), 4 * len(metrics)), squeeze=False, constrained_layout=True
    )
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for i, run in enumerate(runs):
            entry = scores[metric][run]
            stats = [entry["tasks"][t] for t in tasks] + [entry["mean"], entry["worst"]]
            positions = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(columns))]
            ax.bar(positions, [s["mean"] for s in stats], width, yerr=[s["std"] for s in stats], label=run, capsize=2)
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
        ax.set_ylabel(METRIC_LABELS[metric])
        if metric == "raw":
            lows = [scores[metric][r]["tasks"][t]["mean"] for r in runs for t in tasks]
            ax.set_ylim(min(lows) * 0.95, None)
        if metric == "regret":
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{METRIC_LABELS[metric]}, lower is better (error bars: std over seeds)", fontsize=9)
        ax.legend(fontsize=8)
    _save(fig, output_dir / "comparison_tasks.png", dpi=110)
    if frontier:
        _save(frontier_figure(scores), output_dir / "frontier.png", dpi=110)


def frontier_figure(scores: dict[str, dict[str, Any]], metrics: Sequence[str] | None = None) -> Figure:
    """The trade-off frontier: worst task against mean over tasks, one point per run and seed, one panel per metric
    (``metrics``: any of those in ``scores``, by default all)."""
    plt = _pyplot()
    metrics = list(scores) if metrics is None else list(metrics)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.5), squeeze=False, constrained_layout=True)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for run, entry in scores[metric].items():
            seeds = entry["per_seed"]
            ax.scatter([s["mean"] for s in seeds], [s["worst"] for s in seeds], label=run)
        label = METRIC_LABELS[metric]
        ax.set(xlabel=f"mean over tasks: {label}", ylabel=f"worst task: {label}", title=f"trade-off frontier: {metric}")
        ax.legend(fontsize=8)
    return fig


def plot_decision(summary: dict[str, Any], path: Path) -> Path:
    """``robust-pretrain-decide``'s figure: per-domain held-out loss per arm, a bar at the mean and a dot per seed
    (:func:`robust_pretrain.reporting.decision.summarise`)."""
    plt = _pyplot()
    domains, arms = summary["domains"], list(summary["arms"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(domains)), 4), constrained_layout=True)
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        entry = summary["arms"][arm]
        positions = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(domains))]
        means = [entry["domain_loss"][d] for d in domains]
        ax.bar(positions, means, width, alpha=0.35, label=arm, color=f"C{i}")
        for position, domain in zip(positions, domains, strict=True):
            values = entry["per_seed_domain_loss"][domain]
            ax.plot([position] * len(values), values, "o", markersize=3, color=f"C{i}")
    ax.set_xticks(range(len(domains)), domains, rotation=30, ha="right")
    ax.set_ylim(min(min(summary["arms"][a]["domain_loss"].values()) for a in arms) * 0.95, None)
    ax.set_ylabel("held-out loss (nats), lower is better")
    ax.set_title("per-domain held-out loss per arm (bar: mean over seeds; dots: seeds)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: no dot hidden
    return _save(fig, path, dpi=110)
