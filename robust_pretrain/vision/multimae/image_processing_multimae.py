"""Image processor for MM-MAE: aligned augmentation and decoding of RGB, depth and class-map inputs (PIL + numpy)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image
from transformers import AutoImageProcessor
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from transformers.processing_utils import ImagesKwargs

from robust_pretrain.seeding import SharedEpoch, keyed_rng, stable_hash
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig

if TYPE_CHECKING:
    import torch

MODALITIES = ("rgb", "depth", "semseg")
_INTEGER_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I")


class MultiMAEImageProcessorKwargs(ImagesKwargs, total=False):
    crop_scale: tuple[float, float]
    crop_ratio: tuple[float, float]
    flip_probability: float
    depth_scale: float
    ignore_index: int
    num_classes: int | None
    do_reduce_labels: bool


class MultiMAEImageProcessor(BaseImageProcessor):
    """Turn an example's ``rgb`` / ``depth`` / ``semseg`` (any subset) into aligned tensors of one size.

    Training (``train=True``): one random resized crop (area ``crop_scale`` of the image, aspect ``crop_ratio``,
    as torchvision's ``RandomResizedCrop``) and one horizontal flip (probability ``flip_probability``), identical for
    all modalities of the example; evaluation: the whole image resized to ``size``. Crops are taken in relative
    coordinates, so modalities of one example stored at different resolutions (say depth at half size) are cropped
    consistently; modalities whose *aspect ratios* differ by more than 1% are an error.

    - ``rgb``: PIL or array (H,W), (H,W,C) or (C,H,W) with 1, 3 or 4 channels (grayscale replicated, alpha dropped),
      uint8 or floats in [0, 1]; bilinear (antialiased) resampling; output float32 (3,H,W) normalised with
      ``image_mean`` / ``image_std``.
    - ``depth``: a 16-bit PNG (PIL "I;16"/"I") or integer array in units of ``1/depth_scale`` metres (default
      millimetres, NYUv2), or a float array / PIL "F" image in metres; 0, negative and non-finite values are invalid.
      Resampled without interpolating across invalid pixels: validity follows nearest-neighbour sampling and a valid
      output pixel is the bilinear average of the *valid* input pixels under the filter. Output float32 (1,H,W)
      metres, 0 = invalid. A map with no valid pixel is an error.
    - ``semseg``: class ids (PIL "L"/"P"/"I" or an integer array); nearest-neighbour; output int64 (H,W).
      ``ignore_index`` marks unknown pixels; with ``num_classes`` set, any other id >= ``num_classes`` is an error.
      ``do_reduce_labels`` (transformers' name; mmseg and MultiMAE call it ``reduce_zero_label``) is for maps with
      0 = unlabelled and classes 1..K, such as NYUv2's: 0 becomes ``ignore_index``, every other id ``id - 1``
      (``ignore_index`` stays), before the ``num_classes`` check.

    Calling convention (transformers'): ``processor(images, segmentation_maps=None, depth=None)``; the outputs are
    named after the modalities (``rgb``, ``depth``, ``semseg``), which the MM-MAE models take as keyword inputs.
    :meth:`post_process_semantic_segmentation` and :meth:`post_process_depth_estimation` turn model outputs into
    maps of the original image sizes (the ``image-segmentation`` and ``depth-estimation`` pipelines call them).

    Randomness: ``generators`` (one ``numpy.random.Generator`` per example) makes augmentation reproducible;
    :class:`MultiMAETransform` derives them from ``(seed, epoch, example id)``.
    """

    model_input_names = list(MODALITIES)
    valid_kwargs = MultiMAEImageProcessorKwargs

    def __init__(
        self,
        size: int | Mapping[str, int] | Sequence[int] = 224,
        crop_scale: Sequence[float] = (0.2, 1.0),
        crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip_probability: float = 0.5,
        image_mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
        image_std: Sequence[float] = IMAGENET_DEFAULT_STD,
        depth_scale: float = 1000.0,
        ignore_index: int = 255,
        num_classes: int | None = None,
        do_reduce_labels: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(size, int):
            size = {"height": size, "width": size}
        elif not isinstance(size, Mapping):
            size = {"height": int(size[0]), "width": int(size[1])}
        self.size = {"height": int(size["height"]), "width": int(size["width"])}
        self.crop_scale = tuple(float(v) for v in crop_scale)
        self.crop_ratio = tuple(float(v) for v in crop_ratio)
        self.flip_probability = float(flip_probability)
        self.image_mean = [float(v) for v in image_mean]
        self.image_std = [float(v) for v in image_std]
        self.depth_scale = float(depth_scale)
        self.ignore_index = int(ignore_index)
        self.num_classes = num_classes
        self.do_reduce_labels = bool(do_reduce_labels)
        self._check_settings()

    def _check_settings(self) -> None:
        numbers = {
            "crop_scale": self.crop_scale,
            "crop_ratio": self.crop_ratio,
            "flip_probability": (self.flip_probability,),
            "image_mean": self.image_mean,
            "image_std": self.image_std,
            "depth_scale": (self.depth_scale,),
        }
        for name, values in numbers.items():
            if not all(math.isfinite(value) for value in values):
                raise ValueError(f"{name} must be finite, got {list(values)}")
        if min(self.size.values()) < 1:
            raise ValueError(f"size must be positive, got {self.size}")
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < min <= max <= 1, got {self.crop_scale}")
        if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio must satisfy 0 < min <= max, got {self.crop_ratio}")
        if not 0 <= self.flip_probability <= 1:
            raise ValueError(f"flip_probability must be in [0, 1], got {self.flip_probability}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError("image_mean and image_std need 3 values each, std > 0")
        if self.depth_scale <= 0:
            raise ValueError(f"depth_scale must be > 0 (input units per metre), got {self.depth_scale}")
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.do_reduce_labels and self.ignore_index == 0:
            raise ValueError(
                "do_reduce_labels maps 0 to ignore_index and 1 to class 0; ignore_index 0 would merge them"
            )

    def __call__(self, images: Any = None, *args: Any, **kwargs: Any) -> BatchFeature:
        """:meth:`preprocess`; unlike the base class, ``images`` (RGB) may be left out (depth / semseg only)."""
        return self.preprocess(images, *args, **kwargs)

    def preprocess(
        self,
        images: Any = None,
        segmentation_maps: Any = None,
        *,
        depth: Any = None,
        semseg: Any = None,
        train: bool = False,
        generators: Sequence[np.random.Generator] | None = None,
        names: Sequence[str] | None = None,
        return_tensors: str | None = "pt",
    ) -> BatchFeature:
        """Process one example or a batch (lists); ``images`` is the RGB modality, ``segmentation_maps`` (or
        ``semseg``, its modality name) the class maps, ``depth`` the depth maps. ``names`` label the examples in
        error messages. ``train=True`` augments, drawing from ``generators`` (one per example; fresh OS entropy if
        not given). Returns a ``BatchFeature`` with ``rgb`` (B,3,H,W), ``depth`` (B,1,H,W), ``semseg`` (B,H,W) for
        the modalities given."""
        if segmentation_maps is not None and semseg is not None:
            raise ValueError("give the class maps once, as segmentation_maps or as semseg")
        semseg = segmentation_maps if segmentation_maps is not None else semseg
        given = {
            name: value for name, value in zip(MODALITIES, (images, depth, semseg), strict=True) if value is not None
        }
        if not given:
            raise ValueError("no input: pass images (RGB), depth and/or semseg")
        batched = {name: _as_batch(v) for name, v in given.items()}
        count = len(next(iter(batched.values())))
        if any(len(v) != count for v in batched.values()):
            counts = {k: len(v) for k, v in batched.items()}
            raise ValueError(f"modalities hold different numbers of examples: {counts}")
        if train and generators is None:
            generators = [np.random.default_rng() for _ in range(count)]
        if train and len(generators) != count:
            raise ValueError(f"got {len(generators)} generators for {count} examples")
        examples = [
            self.process_example(
                {name: v[i] for name, v in batched.items()},
                train=train,
                rng=generators[i] if train else None,
                name=names[i] if names else f"#{i}",
            )
            for i in range(count)
        ]
        data = {name: np.stack([e[name] for e in examples]) for name in batched}
        return BatchFeature(data=data, tensor_type=return_tensors)

    def post_process_semantic_segmentation(
        self, outputs: Any, target_sizes: Sequence[Sequence[int]] | torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Class maps (H,W) int64 from a semantic segmentation output's ``logits`` (B,C,h,w): per image, the logits
        upsampled (bilinear) to its ``target_sizes`` entry (height, width) before the argmax, else at their own
        size."""
        logits = outputs.logits
        sizes = _target_sizes(target_sizes, len(logits), "logits")
        return [
            (image_logits if size is None else _resize_map(image_logits, size)).argmax(dim=0)
            for image_logits, size in zip(logits, sizes, strict=True)
        ]

    def post_process_depth_estimation(
        self, outputs: Any, target_sizes: Sequence[Sequence[int]] | torch.Tensor | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """``[{"predicted_depth": (H,W) metres}]`` from a depth output's ``predicted_depth`` (B,h,w): per image,
        upsampled (bilinear, which keeps depth within its range) to its ``target_sizes`` entry (height, width), else
        at its own size."""
        predicted = outputs.predicted_depth
        sizes = _target_sizes(target_sizes, len(predicted), "predicted_depth")
        return [
            {"predicted_depth": depth if size is None else _resize_map(depth[None], size)[0]}
            for depth, size in zip(predicted, sizes, strict=True)
        ]

    def process_example(
        self,
        example: Mapping[str, Any],
        train: bool = False,
        rng: np.random.Generator | None = None,
        name: str = "example",
    ) -> dict[str, np.ndarray]:
        """One example (a mapping of modality -> raw input) -> arrays; ``name`` is used in error messages."""
        decoded = self.decode_example(example, name)
        reference_height, reference_width = next(iter(decoded.values())).shape[:2]
        if train:
            if rng is None:
                raise ValueError("train=True needs a numpy Generator for the augmentation")
            box = self.random_crop_box(reference_width, reference_height, rng)
            flip = bool(rng.random() < self.flip_probability)
        else:
            box, flip = (0.0, 0.0, 1.0, 1.0), False
        out = {}
        for modality, array in decoded.items():
            resized = getattr(self, f"_resize_{modality}")(array, box)
            out[modality] = np.ascontiguousarray(resized[..., ::-1] if flip else resized)
        return out

    def decode_example(self, example: Mapping[str, Any], name: str = "example") -> dict[str, np.ndarray]:
        """Decode and check the modalities present: rgb (H,W,3) uint8, depth (H,W) metres, semseg (H,W) int64.

        Raises ``ValueError`` (prefixed with ``name``) for unusable input: unknown image modes, a depth map without
        valid pixel, class ids outside ``num_classes``, modalities whose aspect ratios differ by more than 1%.
        """
        decoded = {}
        if example.get("rgb") is not None:
            decoded["rgb"] = _decode_rgb(example["rgb"], name)
        if example.get("depth") is not None:
            decoded["depth"] = self._decode_depth(example["depth"], name)
        if example.get("semseg") is not None:
            decoded["semseg"] = self._decode_classes(example["semseg"], name)
        if not decoded:
            raise ValueError(f"{name}: none of the modalities {MODALITIES} is present")
        sizes = {m: (a.shape[1], a.shape[0]) for m, a in decoded.items()}  # (width, height)
        aspects = {m: w / h for m, (w, h) in sizes.items()}
        if max(aspects.values()) > 1.01 * min(aspects.values()):
            raise ValueError(
                f"{name}: modalities have different aspect ratios {sizes} (width, height); they must "
                "show the same view (different resolutions of one aspect are resized consistently)"
            )
        return decoded

    def random_crop_box(self, width: float, height: float, rng: np.random.Generator) -> tuple[float, ...]:
        """(left, top, right, bottom) as fractions of the image: torchvision's RandomResizedCrop sampling."""
        area = width * height
        log_ratio = (math.log(self.crop_ratio[0]), math.log(self.crop_ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.crop_scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            crop_w, crop_h = math.sqrt(target * aspect), math.sqrt(target / aspect)
            if crop_w <= width and crop_h <= height:
                left, top = rng.uniform(0, width - crop_w), rng.uniform(0, height - crop_h)
                return left / width, top / height, (left + crop_w) / width, (top + crop_h) / height
        aspect = min(max(width / height, self.crop_ratio[0]), self.crop_ratio[1])  # fallback: central crop
        crop_w, crop_h = min(width, height * aspect), min(height, width / aspect)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        return left / width, top / height, (left + crop_w) / width, (top + crop_h) / height

    def _output_size(self) -> tuple[int, int]:
        return self.size["width"], self.size["height"]

    @staticmethod
    def _pixel_box(box: Sequence[float], array: np.ndarray) -> tuple[float, ...]:
        height, width = array.shape[:2]
        return box[0] * width, box[1] * height, box[2] * width, box[3] * height

    def _resize_rgb(self, array: np.ndarray, box: Sequence[float]) -> np.ndarray:
        image = Image.fromarray(array).resize(
            self._output_size(), Image.Resampling.BILINEAR, box=self._pixel_box(box, array)
        )
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        pixels = (pixels - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
        return pixels.transpose(2, 0, 1)

    def _resize_depth(self, metres: np.ndarray, box: Sequence[float]) -> np.ndarray:
        valid = metres > 0
        pixel_box = self._pixel_box(box, metres)

        def resample(values: np.ndarray, method: Image.Resampling) -> np.ndarray:
            image = Image.fromarray(values.astype(np.float32))
            return np.asarray(image.resize(self._output_size(), method, box=pixel_box))

        total = resample(np.where(valid, metres, 0.0), Image.Resampling.BILINEAR)
        weight = resample(valid, Image.Resampling.BILINEAR)
        keep = (resample(valid, Image.Resampling.NEAREST) > 0.5) & (weight > 1e-6)
        return np.where(keep, total / np.maximum(weight, 1e-6), 0.0).astype(np.float32)[None]

    def _resize_semseg(self, classes: np.ndarray, box: Sequence[float]) -> np.ndarray:
        image = Image.fromarray(classes.astype(np.int32))
        resized = image.resize(self._output_size(), Image.Resampling.NEAREST, box=self._pixel_box(box, classes))
        return np.asarray(resized).astype(np.int64)

    def _decode_depth(self, value: Any, name: str) -> np.ndarray:
        if isinstance(value, Image.Image):
            if value.mode in _INTEGER_DEPTH_MODES:
                metres = np.asarray(value).astype(np.float64) / self.depth_scale
            elif value.mode == "F":
                metres = np.asarray(value, dtype=np.float64)
            else:
                raise ValueError(
                    f"{name}: depth image has mode {value.mode!r}; give a 16-bit PNG (mode I;16, units "
                    f"of 1/{self.depth_scale:g} m) or float metres (mode F or a float array)"
                )
        else:
            array = _squeeze_channel(_as_array(value), name, "depth")
            metres = array / self.depth_scale if np.issubdtype(array.dtype, np.integer) else array.astype(np.float64)
        metres = np.where(np.isfinite(metres) & (metres > 0), metres, 0.0)
        if not (metres > 0).any():
            raise ValueError(f"{name}: depth map has no valid pixel (all 0, negative or non-finite)")
        return metres

    def _decode_classes(self, value: Any, name: str) -> np.ndarray:
        if isinstance(value, Image.Image):
            if value.mode not in ("L", "P", "I", "I;16", "I;16B", "I;16L"):
                raise ValueError(
                    f"{name}: semseg image has mode {value.mode!r}; give a class-id map (mode L, P or "
                    "I), not a colour rendering"
                )
            classes = np.asarray(value).astype(np.int64)
        else:
            array = _squeeze_channel(_as_array(value), name, "semseg")
            if not np.issubdtype(array.dtype, np.integer):
                if not np.array_equal(array, np.round(array)):
                    raise ValueError(f"{name}: semseg holds non-integer values; give integer class ids")
            classes = array.astype(np.int64)
        if self.do_reduce_labels:
            classes = np.where(
                classes == 0, self.ignore_index, np.where(classes == self.ignore_index, classes, classes - 1)
            )
        if self.num_classes is not None:
            bad = np.unique(classes[(classes != self.ignore_index) & ((classes < 0) | (classes >= self.num_classes))])
            if bad.size:
                if self.do_reduce_labels:
                    raise ValueError(
                        f"{name}: semseg has class ids {(bad[:5] + 1).tolist()}, outside 1..{self.num_classes} "
                        f"(do_reduce_labels: 0 = unlabelled, 1..{self.num_classes} = the {self.num_classes} classes; "
                        f"after the reduction {bad[:5].tolist()}, ignore_index {self.ignore_index}); raise "
                        "num_classes or map them to the ignore value"
                    )
                if bad.tolist() == [self.num_classes]:  # ids up to K: 0 may mean unlabelled (NYUv2's raw maps)
                    raise ValueError(
                        f"{name}: semseg has class id {self.num_classes} outside 0..{self.num_classes - 1}: if 0 "
                        f"marks unlabelled pixels and 1..{self.num_classes} the classes (NYUv2's raw labels), pass "
                        "--do_reduce_labels true (do_reduce_labels=True); otherwise raise num_classes"
                    )
                raise ValueError(
                    f"{name}: semseg has class ids {bad[:5].tolist()} outside 0..{self.num_classes - 1} "
                    f"(ignore_index {self.ignore_index}); raise num_classes or map them to the ignore "
                    "value"
                )
        return classes


def _target_sizes(
    target_sizes: Sequence[Sequence[int]] | torch.Tensor | None, count: int, output_name: str
) -> list[tuple[int, int] | None]:
    """One (height, width) or None per image; ``target_sizes`` as a list of pairs or a (B, 2) tensor."""
    if target_sizes is None:
        return [None] * count
    if len(target_sizes) != count:
        raise ValueError(f"got {len(target_sizes)} target_sizes for the {count} images of {output_name}")
    sizes = [tuple(int(side) for side in size) for size in target_sizes]
    if any(len(size) != 2 or min(size) < 1 for size in sizes):
        raise ValueError(f"target_sizes are (height, width) pairs of positive sides, got {sizes}")
    return sizes


def _resize_map(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(C,h,w) -> (C,H,W), bilinear (as the MM-MAE heads upsample)."""
    from torch.nn import functional as F  # torch only for post-processing model outputs

    return F.interpolate(maps[None].float(), size=size, mode="bilinear", align_corners=False)[0]


def _as_batch(value: Any) -> list:
    """A list of examples: an image or array is one example; lists and other iterables (a dataset column) hold many."""
    if isinstance(value, Image.Image | np.ndarray) or hasattr(value, "detach") or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def _as_array(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _squeeze_channel(array: np.ndarray, name: str, modality: str) -> np.ndarray:
    if array.ndim == 3 and 1 in (array.shape[0], array.shape[-1]):
        array = array.reshape(array.shape[1:] if array.shape[0] == 1 else array.shape[:-1])
    if array.ndim != 2:
        raise ValueError(f"{name}: {modality} must be a single-channel (H, W) map, got shape {array.shape}")
    return array


def _decode_rgb(value: Any, name: str) -> np.ndarray:
    """(H, W, 3) uint8 from PIL (any mode) or an array of 1, 3 or 4 channels (channels first or last)."""
    if isinstance(value, Image.Image):
        if value.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
            raise ValueError(f"{name}: rgb image has mode {value.mode!r} (a depth or class map?); give an 8-bit image")
        return np.asarray(value.convert("RGB"))
    array = _as_array(value)
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{name}: rgb must have 1, 3 or 4 channels, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        array = np.round(np.clip(array, 0.0, 1.0) * 255)
    array = array.astype(np.uint8)
    return np.repeat(array, 3, axis=-1) if array.shape[-1] == 1 else np.ascontiguousarray(array[..., :3])


@dataclass
class MultiMAETransform:
    """A ``datasets`` transform (``dataset.set_transform(transform)``): rows -> processed per-example arrays.

    Keeps ``id`` and ``label`` columns (when present) beside the modalities, so the collator and classification
    heads find them. Augmentation draws from ``keyed_rng(seed, epoch, ("augment", id))`` (content hash without an
    ``id``): reproducible, worker- and resume-independent; ``set_epoch`` (or
    ``robust_pretrain.seeding.SetEpochCallback``) gives each epoch new crops.
    """

    processor: MultiMAEImageProcessor
    train: bool = False
    seed: int = 0
    column_mapping: Mapping[str, str] = field(default_factory=lambda: {m: m for m in MODALITIES})
    keep_columns: Sequence[str] = ("id", "label")
    key_column: str = "id"
    _epoch: SharedEpoch = field(default_factory=SharedEpoch, init=False, repr=False)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def __call__(self, batch: Mapping[str, list]) -> dict[str, list]:
        columns = {m: c for m, c in self.column_mapping.items() if c in batch}
        if not columns:
            raise ValueError(f"the dataset has none of the columns {dict(self.column_mapping)}; it has {list(batch)}")
        count = len(batch[next(iter(columns.values()))])
        out: dict[str, list] = {name: [] for name in columns}
        out.update({c: list(batch[c]) for c in self.keep_columns if c in batch})
        epoch = self.epoch
        for row in range(count):
            example = {m: batch[c][row] for m, c in columns.items()}
            key = batch[self.key_column][row] if self.key_column in batch else None
            name = f"row {key}" if key is not None else f"row #{row} of the batch"
            rng = None
            if self.train:
                identity = key if key is not None else stable_hash([np.asarray(v) for v in example.values()])
                rng = keyed_rng(self.seed, epoch, ("augment", identity))
            processed = self.processor.process_example(example, train=self.train, rng=rng, name=name)
            for modality in columns:
                out[modality].append(processed.get(modality))  # None: absent here (the collator fills it)
        return out


AutoImageProcessor.register(MultiMAEConfig, image_processor_classes={"pil": MultiMAEImageProcessor}, exist_ok=True)
