"""Pseudo-labels for MM-MAE: depth and semantic segmentation predicted from RGB by pretrained models.

This is how the paper got depth and semseg for ImageNet: ``transformers.pipeline("depth-estimation")`` and
``pipeline("image-segmentation")`` (semantic subtask) run over an RGB dataset in batches, and their predictions
become the ``depth`` (16-bit PNG, units of ``1/depth_scale`` metres) and ``semseg`` (class-id PNG, ids of the
segmentation model's ``id2label``) modalities, written as the folder layout ``<output_dir>/<split>/{rgb,depth,
semseg}/<id>.png`` or as a parquet dataset ``<output_dir>/data/<split>-00000-of-00001.parquet`` (loadable with
:func:`~robust_pretrain.vision.load_image_folder` / ``load_mapped_dataset``). ``pseudo_labels.json``
records the models and class names. The depth model must predict *metric* depth (e.g. a ZoeDepth or Depth Anything
metric checkpoint); relative-depth models (MiDaS-style inverse depth) would give depth in arbitrary units.

A split is written to a temporary folder first and moved in place at the end: a failed run leaves nothing, and an
existing split is never overwritten.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.options import check_options, option
from robust_pretrain.seeding import stable_hash

logger = logging.getLogger(__name__)

OUTPUT_FORMATS = ("folder", "dataset")
PROVENANCE_FILE = "pseudo_labels.json"


@dataclass
class PseudoLabelArguments:
    """Command-line options of ``recipes/pseudo_label.py``."""

    dataset: str = field(
        metadata={
            "help": "RGB source: a folder layout root (<root>/<split>/rgb/<id>.<ext>) or a "
            "datasets dataset (Hub id or local path)"
        }
    )
    output_dir: str = option(help="where the labelled split is written", path="output_dir")
    split: str = field(default="train", metadata={"help": "split to label"})
    rgb_column: str = field(default="image", metadata={"help": "RGB column of a datasets dataset"})
    id_column: str | None = field(
        default=None, metadata={"help": "id column of a datasets dataset (row numbers if unset)"}
    )
    depth_model: str | None = field(default=None, metadata={"help": "metric depth-estimation model"})
    segmentation_model: str | None = field(default=None, metadata={"help": "semantic segmentation model"})
    output_format: str = option("folder", "folder (NYUv2 layout) or dataset (parquet)", choices=OUTPUT_FORMATS)
    batch_size: int = option(8, "images per model forward", minimum=1)
    depth_scale: float = option(1000.0, "depth PNG units per metre (1000 = millimetres)", above=0)
    device: str = field(default="cpu", metadata={"help": "device of the pipelines (cpu, cuda, cuda:1, ...)"})

    def __post_init__(self) -> None:
        if self.depth_model is None and self.segmentation_model is None:
            raise ValueError("give --depth_model and/or --segmentation_model")
        check_options(self)


def _pipeline(task: str, model: Any, device: str | None) -> Any:
    from transformers import Pipeline, pipeline

    return model if isinstance(model, Pipeline) else pipeline(task, model=model, device=device)


def depth_to_png(predicted: Any, depth_scale: float) -> tuple[Image.Image, int]:
    """Metric depth (metres) -> 16-bit PNG image in units of ``1/depth_scale`` m (0 = invalid: non-finite or <= 0)
    and the number of pixels clipped at the 16-bit maximum."""
    metres = predicted.detach().float().cpu().numpy() if hasattr(predicted, "detach") else np.asarray(predicted)
    units = np.where(np.isfinite(metres) & (metres > 0), np.round(metres * depth_scale), 0.0)
    clipped = int((units > 65535).sum())
    return Image.fromarray(np.minimum(units, 65535).astype(np.uint16)), clipped


def segments_to_class_map(
    segments: Sequence[Mapping[str, Any]], label2id: Mapping[str, int], size: tuple[int, int]
) -> Image.Image:
    """Pipeline segments ({"label", "mask"}) -> a class-id image of ``size`` (width, height): 8-bit if the ids fit,
    else 16-bit. Semantic segments cover every pixel once."""
    classes = np.zeros(size[::-1], dtype=np.int64)
    for segment in segments:
        classes[np.asarray(segment["mask"]) > 0] = label2id[segment["label"]]
    dtype = np.uint8 if max(label2id.values(), default=0) < 255 else np.uint16
    return Image.fromarray(classes.astype(dtype))


def pseudo_label(
    dataset: Any,
    depth_model: Any = None,
    segmentation_model: Any = None,
    *,
    batch_size: int = 8,
    depth_scale: float = 1000.0,
    device: str | None = None,
    rows_per_chunk: int = 256,
) -> Any:
    """Add ``depth`` and/or ``semseg`` columns predicted from the ``rgb`` column of ``dataset``.

    ``depth_model`` / ``segmentation_model``: a model name or path, or a ready ``transformers`` pipeline.
    """
    import datasets

    if depth_model is None and segmentation_model is None:
        raise ValueError("give a depth model and/or a segmentation model")
    if "rgb" not in dataset.column_names:
        raise ValueError(
            f"the dataset has no 'rgb' column (columns: {dataset.column_names}); map one with "
            "robust_pretrain.vision.loaders.load_mapped_dataset"
        )
    targets = [name for name, model in (("depth", depth_model), ("semseg", segmentation_model)) if model is not None]
    taken = [name for name in targets if name in dataset.column_names]
    if taken:
        raise ValueError(f"the dataset already has the column(s) {taken}; drop them to label them again")
    depth_pipe = _pipeline("depth-estimation", depth_model, device) if depth_model is not None else None
    segment_pipe = (
        _pipeline("image-segmentation", segmentation_model, device) if segmentation_model is not None else None
    )
    label2id = {}
    if segment_pipe is not None:
        id2label = segment_pipe.model.config.id2label
        label2id = {label: int(index) for index, label in id2label.items()}
        if len(label2id) != len(id2label):
            raise ValueError(f"{segmentation_model}: id2label repeats label names, so class ids cannot be recovered")
    clipped = 0

    def label_chunk(batch: dict[str, list]) -> dict[str, list]:
        nonlocal clipped
        images = [image.convert("RGB") for image in batch["rgb"]]
        out: dict[str, list] = {}
        if depth_pipe is not None:
            out["depth"] = []
            for prediction in depth_pipe(images, batch_size=batch_size):
                png, count = depth_to_png(prediction["predicted_depth"], depth_scale)
                out["depth"].append(png)
                clipped += count
        if segment_pipe is not None:
            predictions = segment_pipe(images, batch_size=batch_size, subtask="semantic")
            out["semseg"] = [
                segments_to_class_map(segments, label2id, image.size)
                for segments, image in zip(predictions, images, strict=True)
            ]
        return out

    features = dataset.features.copy()
    for name in targets:
        features[name] = datasets.Image()
    fingerprint = f"{stable_hash([dataset._fingerprint, str(depth_model), str(segmentation_model), depth_scale]):x}"
    labelled = dataset.map(
        label_chunk,
        batched=True,
        batch_size=rows_per_chunk,
        features=features,
        new_fingerprint=fingerprint,
        desc="pseudo-labelling",
    )
    if clipped:
        logger.warning(
            "%d depth pixels exceeded the 16-bit range (%.1f m at depth_scale %g) and were clipped",
            clipped,
            65535 / depth_scale,
            depth_scale,
        )
    return labelled


def write_folder_layout(dataset: Any, root: str | Path, split: str) -> Path:
    """Write ``<root>/<split>/<modality>/<id>.<ext>`` for the modality columns (rgb files are copied as they are)."""
    from datasets import Image as ImageFeature

    modalities = [m for m in ("rgb", "depth", "semseg") if m in dataset.column_names]
    target = Path(root) / split
    ids = [str(i) for i in dataset["id"]]
    bad = [i for i in ids if not i or "/" in i or "\\" in i or i.startswith(".")]
    if bad or len(set(ids)) != len(ids):
        raise ValueError(f"ids must be unique file names; offending: {(bad or _duplicates(ids))[:5]}")

    def write(folder: Path) -> None:
        for modality in modalities:
            (folder / modality).mkdir()
            if modality == "rgb":  # the stored file or bytes, not a re-encoding
                for row, stored in enumerate(dataset.cast_column("rgb", ImageFeature(decode=False))["rgb"]):
                    _copy_rgb(stored, folder / "rgb" / ids[row])
            else:
                for row, image in enumerate(dataset[modality]):
                    image.save(folder / modality / f"{ids[row]}.png")

    return _atomic_directory(target, write)


def write_parquet(dataset: Any, root: str | Path, split: str) -> Path:
    """Write the dataset (images embedded) to ``<root>/data/<split>-00000-of-00001.parquet``."""
    from datasets.table import embed_table_storage

    target = Path(root) / "data" / f"{split}-00000-of-00001.parquet"
    if target.exists():
        raise FileExistsError(f"{target} exists; choose another --output_dir or --split (nothing is overwritten)")
    target.parent.mkdir(parents=True, exist_ok=True)
    embedded = dataset.with_format("arrow").map(embed_table_storage, batched=True).with_format(None)
    handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with open(handle, "wb") as stream:
            embedded.to_parquet(stream)
        Path(partial).replace(target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def _duplicates(ids: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({i for i in ids if i in seen or seen.add(i)})


def _copy_rgb(stored: Mapping[str, Any], stem_path: Path) -> None:
    path, data = stored.get("path"), stored.get("bytes")
    if data is None and path and Path(path).is_file():
        shutil.copyfile(path, stem_path.with_suffix(Path(path).suffix.lower()))
        return
    if data is None:
        raise ValueError(f"rgb image {stem_path.name}: neither bytes nor a readable file ({path})")
    with Image.open(io.BytesIO(data)) as image:
        extension = {"JPEG": ".jpg", "PNG": ".png"}.get(image.format or "", None)
        if extension is None:
            image.convert("RGB").save(stem_path.with_suffix(".png"))
            return
    stem_path.with_suffix(extension).write_bytes(data)


def _atomic_directory(target: Path, write: Any) -> Path:
    """Run ``write(folder)`` on a fresh temporary folder beside ``target`` and move it to ``target`` at the end."""
    if target.exists():
        raise FileExistsError(f"{target} exists; choose another --output_dir or --split (nothing is overwritten)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial"))
    try:
        write(partial)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def record_provenance(root: str | Path, split: str, details: Mapping[str, Any]) -> None:
    """Add ``details`` for ``split`` to ``<root>/pseudo_labels.json`` (other splits' entries are kept)."""
    path = Path(root) / PROVENANCE_FILE
    records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    records[split] = dict(details)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    partial.replace(path)


def run(argv: list[str]) -> Path:
    """Label the split ``argv`` names; the path written."""

    from robust_pretrain.config import OptionParser, parse_with_config
    from robust_pretrain.vision.loaders import load_image_folder, load_mapped_dataset

    (args,) = parse_with_config(OptionParser(PseudoLabelArguments, description=__doc__), argv)
    check_checkpoint(args.depth_model, "--depth_model")
    check_checkpoint(args.segmentation_model, "--segmentation_model")
    output = Path(args.output_dir)
    target = (
        output / args.split
        if args.output_format == "folder"
        else output / "data" / f"{args.split}-00000-of-00001.parquet"
    )
    if target.exists():
        raise UsageError(f"--output_dir {output}: {target} exists already; nothing is overwritten")
    source = Path(args.dataset)
    try:
        if (source / args.split / "rgb").is_dir():
            dataset = load_image_folder(source, args.split, modalities=("rgb",))
        else:
            mapping = {"rgb": args.rgb_column} | ({"id": args.id_column} if args.id_column else {})
            dataset = load_mapped_dataset(args.dataset, mapping, split=args.split)
    except (OSError, ValueError) as error:
        raise UsageError(f"--dataset {args.dataset}: {error}") from error
    labelled = pseudo_label(
        dataset,
        args.depth_model,
        args.segmentation_model,
        batch_size=args.batch_size,
        depth_scale=args.depth_scale,
        device=args.device,
    )
    written = (write_folder_layout if args.output_format == "folder" else write_parquet)(labelled, output, args.split)
    details: dict[str, Any] = {
        "source": args.dataset,
        "rows": len(labelled),
        "depth_model": args.depth_model,
        "depth_scale": args.depth_scale,
        "segmentation_model": args.segmentation_model,
    }
    if args.segmentation_model:
        from transformers import AutoConfig

        id2label = AutoConfig.from_pretrained(args.segmentation_model).id2label
        details["class_names"] = [id2label[i] for i in sorted(id2label)]
    record_provenance(output, args.split, details)
    logger.info("wrote %s (%d images)", written, len(labelled))
    return written


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-pseudo-label``, ``recipes/pseudo_label.py``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_console(run, argv, prog="robust-pretrain-pseudo-label")
