"""Multi-modal image datasets from a folder layout or any ``datasets`` dataset, checked before training starts.

Both loaders return a ``datasets.Dataset`` with the columns of the MM-MAE contract: ``id`` (str), the modalities
present among ``rgb``, ``depth``, ``semseg``, and ``label`` when a label column is mapped. A modality the data do not
have is simply not a column (an absent task). Nothing is copied or written: folder images stay files, read lazily.

Checks (``validate=True``, every example, errors name the file or column and row): unreadable or corrupt images;
depth maps without a valid pixel; class ids >= ``num_classes`` (other than ``ignore_index``; with ``do_reduce_labels``,
for maps with 0 = unlabelled and classes 1..K such as NYUv2's, ids above ``num_classes``); images smaller than
one ``patch_size`` patch; modalities of one example with different aspect ratios. Modalities with the same aspect
at different resolutions are accepted: the image processor crops and resizes them consistently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from robust_pretrain.cli import UsageError
from robust_pretrain.vision.multimae.image_processing_multimae import MODALITIES, MultiMAEImageProcessor

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
TARGET_COLUMNS = (*MODALITIES, "id", "label")
# What to do with an example missing from some modality folder: refuse, drop it, or keep it with that modality absent.
UNMATCHED_MODES = ("error", "drop", "partial")
REDUCE_LABELS_HELP = (
    "Semseg maps hold 0 = unlabelled, 1..K = classes (NYUv2): 0 becomes the ignore index, id becomes id - 1 "
    "(mmseg / MultiMAE: reduce_zero_label)."
)
UNMATCHED_HELP = (
    "--image_folder: an example missing from some modality folder is an error, dropped, or kept (partial: the "
    "missing modality is filled with an invalid value and hidden, so it gets no input and no loss)."
)


class UnmatchedStemsError(ValueError):
    """Files of a folder layout whose stem is missing from another modality's folder."""

    def __init__(self, split_dir: Path, unmatched: Mapping[str, list[str]]) -> None:
        self.split_dir = split_dir
        self.unmatched = dict(unmatched)
        super().__init__(
            f"{split_dir}: {describe_unmatched(unmatched)}; add the missing files, remove these, or pass "
            "unmatched='drop' to keep only complete examples or unmatched='partial' to keep them without the "
            "missing modalities"
        )


def unmatched_usage_error(error: UnmatchedStemsError) -> UsageError:
    """The recipes' one-line refusal of an incomplete folder, naming the ``--unmatched`` choices."""
    return UsageError(
        f"--image_folder: {error.split_dir}: {describe_unmatched(error.unmatched)}; add the missing files, or pass "
        "--unmatched drop (keep complete examples only) or --unmatched partial (keep them without those modalities)"
    )


def describe_unmatched(unmatched: Mapping[str, list[str]]) -> str:
    """'files whose stem is not in every modality folder (only in rgb, depth: a, b; only in rgb: c)'."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for stem, folders in sorted(unmatched.items()):
        groups.setdefault(tuple(sorted(folders)), []).append(stem)
    details = "; ".join(
        f"only in {', '.join(folders)}: {', '.join(stems[:10])}"
        + (f" (+{len(stems) - 10} more)" if len(stems) > 10 else "")
        for folders, stems in groups.items()
    )
    return f"files whose stem is not in every modality folder ({details})"


def load_image_folder(
    root: str | Path,
    split: str = "train",
    *,
    modalities: Sequence[str] = MODALITIES,
    unmatched: str = "error",
    ignore_index: int = 255,
    num_classes: int | None = None,
    do_reduce_labels: bool = False,
    depth_scale: float = 1000.0,
    patch_size: int | None = None,
    validate: bool = True,
):
    """Load ``<root>/<split>/{rgb,depth,semseg}/<id>.<ext>``, files matched by stem (the NYUv2 convention).

    ``depth``: 16-bit PNG in units of ``1/depth_scale`` metres (millimetres by default; 0 = invalid) or a float TIFF
    in metres; ``semseg``: 8-bit PNG class ids, ``ignore_index`` for unlabelled pixels (use the same value in the
    image processor and model config), or 0 for unlabelled and 1..K for the classes with ``do_reduce_labels`` (the
    files stay as they are: the check here and the image processor, given the same setting, reduce the ids).
    Modality folders that do not exist are absent tasks. ``unmatched``: a stem
    missing from some modality folder is an error listing them (``"error"``), is dropped with a warning listing
    them (``"drop"``), or is kept with ``None`` in the columns of the modalities it lacks (``"partial"``, with a
    warning; the collator fills such a modality with an invalid value and hides it).
    """
    import datasets

    split_dir = Path(root) / split
    unknown = sorted(set(modalities) - set(MODALITIES))
    if unknown:
        raise ValueError(f"unknown modalities {unknown}; choose from {MODALITIES}")
    if unmatched not in UNMATCHED_MODES:
        raise ValueError(f"unmatched must be one of {', '.join(map(repr, UNMATCHED_MODES))}, got {unmatched!r}")
    folders = {m: split_dir / m for m in modalities if (split_dir / m).is_dir()}
    if not folders:
        raise FileNotFoundError(f"{split_dir}: no modality folder ({', '.join(modalities)}) found")
    files = {modality: _files_by_stem(folder) for modality, folder in folders.items()}
    all_stems = set().union(*files.values())
    complete = sorted(set.intersection(*(set(stems) for stems in files.values())))
    partial = {stem: [m for m in files if stem in files[m]] for stem in sorted(all_stems - set(complete))}
    if partial:
        if unmatched == "error":
            raise UnmatchedStemsError(split_dir, partial)
        action = "kept without the missing modalities" if unmatched == "partial" else "dropped"
        logger.warning("%s: %s %d %s", split_dir, action, len(partial), describe_unmatched(partial))
    kept = sorted(all_stems) if unmatched == "partial" else complete
    if not kept:
        raise ValueError(f"{split_dir}: no example has all of {sorted(files)}")
    columns: dict[str, list] = {"id": kept}
    for modality, found in files.items():
        columns[modality] = [str(found[stem]) if stem in found else None for stem in kept]
    if validate:
        checker = _Checker(ignore_index, num_classes, do_reduce_labels, depth_scale, patch_size)
        for row, stem in enumerate(kept):
            paths = {m: columns[m][row] for m in files if columns[m][row] is not None}
            checker.check(
                {m: _open_image(path) for m, path in paths.items()}, f"example {stem!r} ({', '.join(paths.values())})"
            )
    features = datasets.Features({"id": datasets.Value("string"), **{m: datasets.Image() for m in files}})
    description = (
        f"image folder {split_dir} (modalities {sorted(files)}, depth_scale {depth_scale}, ignore_index {ignore_index}"
        + (", do_reduce_labels" if do_reduce_labels else "")
        + ")"
    )
    return datasets.Dataset.from_dict(
        columns, features=features, split=split, info=datasets.DatasetInfo(description=description, features=features)
    )


def load_mapped_dataset(
    source: Any,
    column_mapping: Mapping[str, str],
    *,
    split: str | None = "train",
    name: str | None = None,
    ignore_index: int = 255,
    num_classes: int | None = None,
    do_reduce_labels: bool = False,
    depth_scale: float = 1000.0,
    patch_size: int | None = None,
    validate: bool = True,
    **load_kwargs: Any,
):
    """Any ``datasets`` dataset (a ``Dataset``, or a Hub id / local path for ``datasets.load_dataset``) with its
    columns mapped to the MM-MAE ones: ``column_mapping`` = {target: source column}, targets among ``rgb``,
    ``depth``, ``semseg``, ``id``, ``label``; e.g. ``{"rgb": "image", "depth": "depth_map"}``. Unmapped modalities
    are absent tasks; without an ``id`` mapping, ids are the row numbers. Depth columns may hold 16-bit images, float
    images or float arrays (metres); class-map columns images or integer arrays."""
    import datasets

    unknown = sorted(set(column_mapping) - set(TARGET_COLUMNS))
    if unknown:
        raise ValueError(f"column_mapping has unknown targets {unknown}; targets are {TARGET_COLUMNS}")
    if not set(column_mapping) & set(MODALITIES):
        raise ValueError(f"column_mapping maps no modality; map at least one of {MODALITIES} to a column")
    if isinstance(source, str | Path):
        dataset = datasets.load_dataset(str(source), name, split=split, **load_kwargs)
        origin = f"{source}" + (f" [{split}]" if split else "")
    else:
        dataset, origin = source, "the dataset"
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"{origin}: expected one split (a datasets.Dataset), got {type(dataset).__name__}; pass split")
    missing = {target: column for target, column in column_mapping.items() if column not in dataset.column_names}
    if missing:
        raise ValueError(
            f"{origin}: no column {', '.join(map(repr, missing.values()))} (mapped to "
            f"{', '.join(missing)}); its columns are {dataset.column_names}"
        )
    sources = list(dict.fromkeys(column_mapping.values()))
    if len(sources) != len(column_mapping):
        raise ValueError(f"column_mapping maps one column to several targets: {dict(column_mapping)}")
    dataset = dataset.select_columns(sources)
    renames = {column: target for target, column in column_mapping.items() if column != target}
    if renames:
        dataset = dataset.rename_columns(renames)
    if "id" not in column_mapping:
        dataset = dataset.add_column("id", [str(i) for i in range(len(dataset))])
    elif dataset.features["id"] != datasets.Value("string"):
        dataset = dataset.cast_column("id", datasets.Value("string"))
    if validate:
        checker = _Checker(ignore_index, num_classes, do_reduce_labels, depth_scale, patch_size)
        present = [m for m in MODALITIES if m in column_mapping]
        described = ", ".join(f"{m}={column_mapping[m]!r}" for m in present)
        for row, example in enumerate(dataset.select_columns(present + ["id"])):
            checker.check({m: example[m] for m in present}, f"{origin} row {row} (id {example['id']!r}; {described})")
    return dataset


class _Checker:
    """Decodes an example with the image processor's rules and applies the dataset-level checks."""

    def __init__(
        self,
        ignore_index: int,
        num_classes: int | None,
        do_reduce_labels: bool,
        depth_scale: float,
        patch_size: int | None,
    ):
        self.processor = MultiMAEImageProcessor(
            ignore_index=ignore_index,
            num_classes=num_classes,
            do_reduce_labels=do_reduce_labels,
            depth_scale=depth_scale,
        )
        self.patch_size = patch_size

    def check(self, example: Mapping[str, Any], name: str) -> None:
        decoded = self.processor.decode_example(example, name)
        if self.patch_size:
            small = {m: a.shape[:2] for m, a in decoded.items() if min(a.shape[:2]) < self.patch_size}
            if small:
                raise ValueError(
                    f"{name}: smaller than one {self.patch_size}x{self.patch_size} patch: "
                    f"{ {m: f'{h}x{w}' for m, (h, w) in small.items()} } (height x width)"
                )


def _files_by_stem(folder: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.suffix.lower() not in IMAGE_EXTENSIONS:
            raise ValueError(f"{path}: not an image file ({', '.join(IMAGE_EXTENSIONS)}); remove it from {folder}")
        if path.stem in files:
            raise ValueError(f"{folder}: two files with the stem {path.stem!r}: {files[path.stem].name}, {path.name}")
        files[path.stem] = path
    return files


def _open_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except Exception as error:  # PIL raises many types for broken files
        raise ValueError(f"{path}: cannot read the image ({type(error).__name__}: {error})") from error


def modalities_without_targets(
    dataset: Any, processor: MultiMAEImageProcessor, has_target: Mapping[str, Callable[[Any], bool]]
) -> dict[str, bool]:
    """The modalities of ``has_target`` (columns of ``dataset``) of which no example has a target, each with whether
    any example has the modality at all: decoded by ``processor``, a map has a target when ``has_target[name](map)``
    holds. Reading stops once every modality has one (at the first example, in usual data)."""
    pending = [name for name in has_target if name in dataset.column_names]
    found: set[str] = set()
    present: set[str] = set()
    for index, example in enumerate(dataset.select_columns(pending) if pending else []):
        for name in pending:
            value = example[name]
            if name not in found and value is not None:
                present.add(name)
                if has_target[name](processor.decode_example({name: value}, f"row {index}")[name]):
                    found.add(name)
        if len(found) == len(pending):
            break
    return {name: name in present for name in pending if name not in found}
