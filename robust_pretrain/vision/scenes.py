"""Procedural indoor scenes with mutually consistent RGB, metric depth and semantic classes (numpy only, seeded).

A pinhole camera (vertical field of view ``fov_degrees``, pitched down) stands at the origin, ``camera_height``
above a floor (plane ``y = -camera_height``) in a room closed by a back wall and two side walls (no ceiling: the
walls go up out of view). On the floor stand 1-``max_objects`` objects of the three *object classes* (box, rotated
about the vertical; sphere; vertical cylinder), and up to ``max_distractors`` *distractors* lie flat on the floor
(rugs) or hang on the back wall (pictures): they have their own class but no relief, so depth cannot see them.

Every pixel's ray is intersected with all surfaces (analytic ray casting): ``depth`` is the metric z-depth along
the optical axis (the NYUv2 convention), ``semseg`` the class of the nearest surface, and ``rgb`` its albedo,
Lambert-shaded by a directional light plus ambient light, with Gaussian sensor noise. Albedos are a
class-dependent hue mixed with a *fine texture* (stripes or checks of ``texture_frequency`` cycles per metre, a few
pixels per period): RGB carries the most sub-patch detail and is the hard modality to reconstruct (measured by
:func:`subpatch_variance_fraction`), depth the easiest (piecewise smooth), semseg in between (piecewise constant).

The image-level ``label`` (for classification fine-tuning) is the *dominant object*: the object class (box, sphere
or cylinder, :data:`LABEL_NAMES`) covering the most pixels; ties go to the earlier class in that list.
Image ``i`` of a split is a pure function of ``(seed, split, i)``, so splits are disjoint and reproducible, and the
dataset's fingerprint is deterministic. ``train``/``test`` are for pre-training, ``downstream_train`` /
``downstream_test`` hold different scenes for fine-tuning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

CLASS_NAMES = ("floor", "wall", "box", "sphere", "cylinder", "rug", "picture")
FLOOR, WALL, BOX, SPHERE, CYLINDER, RUG, PICTURE = range(len(CLASS_NAMES))
NUM_CLASSES = len(CLASS_NAMES)
OBJECT_CLASSES = (BOX, SPHERE, CYLINDER)
LABEL_NAMES = tuple(CLASS_NAMES[c] for c in OBJECT_CLASSES)
SPLITS = ("train", "test", "downstream_train", "downstream_test")
GENERATOR_VERSION = 1  # part of the fingerprint: bump when the rendering changes
# Hue (degrees) per class: colour is a cue for the class, but overlapping ranges keep it from being the whole answer.
_CLASS_HUES = {
    FLOOR: (20, 45),
    WALL: (30, 200),
    BOX: (0, 40),
    SPHERE: (100, 160),
    CYLINDER: (200, 260),
    RUG: (280, 360),
    PICTURE: (0, 360),
}


@dataclass(frozen=True)
class SceneConfig:
    """Scene and rendering parameters (all lengths in metres)."""

    image_size: int = 64
    fov_degrees: float = 60.0
    camera_height: tuple[float, float] = (1.1, 1.6)
    pitch_degrees: tuple[float, float] = (8.0, 22.0)
    room_depth: tuple[float, float] = (4.0, 7.0)
    room_half_width: tuple[float, float] = (2.0, 3.5)
    max_objects: int = 4
    max_distractors: int = 2
    texture_frequency: tuple[float, float] = (2.0, 6.0)
    noise_std: float = 0.02

    def __post_init__(self) -> None:
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8 pixels, got {self.image_size}")
        if self.max_objects < 1 or self.max_distractors < 0:
            raise ValueError("max_objects must be >= 1 and max_distractors >= 0")
        if not 10.0 <= self.fov_degrees <= 120.0:
            raise ValueError(f"fov_degrees must be in [10, 120], got {self.fov_degrees}")


@dataclass
class Material:
    """Albedo = base * (1 - s) + accent * s, with s a stripe or check pattern of ``frequency`` cycles per metre."""

    base: np.ndarray
    accent: np.ndarray
    pattern: str  # "stripes" | "checks"
    frequency: float
    angle: float


@dataclass
class Primitive:
    """An object standing on the floor: ``kind`` is a class id (BOX, SPHERE, CYLINDER).

    ``center`` is the centre for spheres and boxes, the base centre for cylinders; ``size`` is (radius,) for
    spheres, (radius, height) for cylinders, half extents (x, y, z) for boxes; ``yaw`` rotates boxes about y.
    """

    kind: int
    center: np.ndarray
    size: tuple[float, ...]
    material: Material
    yaw: float = 0.0


@dataclass
class Decal:
    """A flat distractor: a rug (disc of ``size=(radius,)`` on the floor, centre (x, z)) or a picture (rectangle of
    ``size=(half width, half height)`` on the back wall, centre (x, y))."""

    kind: int
    center: np.ndarray
    size: tuple[float, ...]
    material: Material


@dataclass
class Scene:
    camera_height: float
    pitch: float  # radians, positive = looking down
    room_depth: float
    room_half_width: float
    light: np.ndarray  # unit vector towards the light
    floor: Material
    wall: Material
    objects: list[Primitive] = field(default_factory=list)
    decals: list[Decal] = field(default_factory=list)


@dataclass
class RenderedScene:
    rgb: np.ndarray  # float32 (H, W, 3) in [0, 1]
    depth: np.ndarray  # float32 (H, W) metres (z-depth)
    semseg: np.ndarray  # uint8 (H, W) class ids


def camera_rays(config: SceneConfig, pitch: float) -> np.ndarray:
    """World directions ``(H*W, 3)`` of the pixel rays (row-major), scaled so their camera-frame z is 1.

    Hence a hit at ``t * ray`` lies at z-depth ``t``. Pixel centres; x right, y up, the camera looks along +z and is
    pitched down by ``pitch``.
    """
    size = config.image_size
    focal = (size / 2) / np.tan(np.radians(config.fov_degrees) / 2)
    coords = (np.arange(size) + 0.5 - size / 2) / focal
    x, y = np.meshgrid(coords, -coords)
    camera = np.stack([x, y, np.ones_like(x)], axis=-1).reshape(-1, 3)
    cos, sin = np.cos(pitch), np.sin(pitch)
    rotation = np.array([[1, 0, 0], [0, cos, -sin], [0, sin, cos]])  # about x: the optical axis tilts to -y
    return camera @ rotation.T


def _hsv(hue: float, saturation: float, value: float) -> np.ndarray:
    k = (np.array([5.0, 3.0, 1.0]) + hue / 60.0) % 6
    return value - value * saturation * np.clip(np.minimum(k, 4 - k), 0, 1)


def _material(rng: np.random.Generator, kind: int, config: SceneConfig) -> Material:
    low, high = _CLASS_HUES[kind]
    hue = rng.uniform(low, high) % 360
    base = _hsv(hue, rng.uniform(0.35, 0.8), rng.uniform(0.55, 0.95))
    accent = _hsv((hue + rng.uniform(-30, 30)) % 360, rng.uniform(0.2, 0.9), rng.uniform(0.2, 0.6))
    return Material(
        base,
        accent,
        str(rng.choice(["stripes", "checks"])),
        float(rng.uniform(*config.texture_frequency)),
        float(rng.uniform(0, np.pi)),
    )


def sample_scene(rng: np.random.Generator, config: SceneConfig) -> Scene:
    """Draw a random scene; objects stand inside the room and in front of the camera, not overlapping."""
    scene = Scene(
        camera_height=rng.uniform(*config.camera_height),
        pitch=np.radians(rng.uniform(*config.pitch_degrees)),
        room_depth=rng.uniform(*config.room_depth),
        room_half_width=rng.uniform(*config.room_half_width),
        light=_unit(np.array([rng.uniform(-1, 1), rng.uniform(0.8, 1.5), rng.uniform(-1.0, 0.3)])),
        floor=_material(rng, FLOOR, config),
        wall=_material(rng, WALL, config),
    )
    half_fov = np.tan(np.radians(config.fov_degrees) / 2)
    footprints: list[tuple[float, float, float]] = []
    for _ in range(int(rng.integers(1, config.max_objects + 1))):
        for _attempt in range(20):
            kind = int(rng.choice(OBJECT_CLASSES))
            radius = rng.uniform(0.25, 0.55)
            z = rng.uniform(1.8, scene.room_depth - radius - 0.2)
            x_limit = min(0.75 * z * half_fov, scene.room_half_width - radius - 0.1)
            x = rng.uniform(-x_limit, x_limit)
            if all(np.hypot(x - fx, z - fz) > radius + fr for fx, fz, fr in footprints):
                break
        else:
            continue
        footprints.append((x, z, radius))
        floor_y = -scene.camera_height
        material = _material(rng, kind, config)
        if kind == SPHERE:
            scene.objects.append(Primitive(kind, np.array([x, floor_y + radius, z]), (radius,), material))
        elif kind == CYLINDER:
            height = rng.uniform(0.5, 1.3)
            scene.objects.append(Primitive(kind, np.array([x, floor_y, z]), (radius * 0.8, height), material))
        else:
            half = (radius * 0.7, rng.uniform(0.2, 0.6), radius * 0.7)
            scene.objects.append(
                Primitive(
                    kind, np.array([x, floor_y + half[1], z]), half, material, yaw=float(rng.uniform(0, np.pi / 2))
                )
            )
    for _ in range(int(rng.integers(0, config.max_distractors + 1))):
        if rng.random() < 0.5:
            z = rng.uniform(1.5, scene.room_depth - 0.5)
            x = rng.uniform(-0.6, 0.6) * z * half_fov
            scene.decals.append(Decal(RUG, np.array([x, z]), (rng.uniform(0.3, 0.8),), _material(rng, RUG, config)))
        else:
            center = np.array([rng.uniform(-1.5, 1.5), rng.uniform(0.0, 1.2) - 0.3])
            scene.decals.append(
                Decal(PICTURE, center, (rng.uniform(0.3, 0.8), rng.uniform(0.25, 0.5)), _material(rng, PICTURE, config))
            )
    return scene


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector, axis=-1, keepdims=True)


def _plane_hits(rays: np.ndarray, axis: int, value: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        t = value / rays[:, axis]
    return np.where(t > 1e-6, t, np.inf)


def _smallest_positive_root(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest positive root of a t^2 + 2 b t + c = 0 per ray (inf if none), and the far root."""
    discriminant = b * b - a * c
    root = np.sqrt(np.maximum(discriminant, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        near, far = (-b - root) / a, (-b + root) / a
    near = np.where((discriminant >= 0) & (near > 1e-6), near, np.inf)
    return near, np.where(discriminant >= 0, far, -np.inf)


def _bounding_sphere(obj: Primitive) -> tuple[np.ndarray, float]:
    if obj.kind == SPHERE:
        return obj.center, obj.size[0]
    if obj.kind == CYLINDER:
        radius, height = obj.size
        return obj.center + np.array([0.0, height / 2, 0.0]), float(np.hypot(radius, height / 2))
    return obj.center, float(np.linalg.norm(obj.size))


def _intersect_culled(obj: Primitive, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_intersect` on the rays that meet ``obj``'s bounding sphere only (misses elsewhere): much faster."""
    center, radius = _bounding_sphere(obj)
    along = rays @ center
    candidates = np.flatnonzero(along * along - (rays * rays).sum(1) * (center @ center - radius**2) >= 0)
    t, normal, uv = np.full(len(rays), np.inf), np.zeros_like(rays), np.zeros((len(rays), 2))
    t[candidates], normal[candidates], uv[candidates] = _intersect(obj, rays[candidates])
    return t, normal, uv


def _intersect(obj: Primitive, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ray parameter t (inf = miss), unit normals and texture coordinates (metres) of the hits on ``obj``."""
    if obj.kind == SPHERE:
        (radius,) = obj.size
        t, _ = _smallest_positive_root((rays * rays).sum(1), -(rays @ obj.center), obj.center @ obj.center - radius**2)
        offset = np.where(np.isfinite(t)[:, None], rays * t[:, None], obj.center) - obj.center
        normal = offset / radius
        longitude, latitude = np.arctan2(normal[:, 0], normal[:, 2]), np.arcsin(np.clip(normal[:, 1], -1, 1))
        uv = np.stack([longitude, latitude], 1) * radius
        return t, normal, uv
    if obj.kind == CYLINDER:
        radius, height = obj.size
        flat, center = rays[:, [0, 2]], obj.center[[0, 2]]
        side, _ = _smallest_positive_root((flat * flat).sum(1), -(flat @ center), center @ center - radius**2)
        side_y = rays[:, 1] * side
        side = np.where((side_y >= obj.center[1]) & (side_y <= obj.center[1] + height), side, np.inf)
        top = _plane_hits(rays, 1, obj.center[1] + height)
        top_xz = rays[:, [0, 2]] * np.where(np.isfinite(top), top, 0)[:, None] - center
        top = np.where((top_xz**2).sum(1) <= radius**2, top, np.inf)
        t = np.minimum(side, top)
        point = rays * np.where(np.isfinite(t), t, 0)[:, None]
        radial = point[:, [0, 2]] - center
        on_side = side <= top
        normal = np.where(
            on_side[:, None],
            np.stack([radial[:, 0], np.zeros(len(t)), radial[:, 1]], 1) / radius,
            np.array([0.0, 1.0, 0.0]),
        )
        angle = np.arctan2(radial[:, 0], radial[:, 1]) * radius
        uv = np.where(on_side[:, None], np.stack([angle, point[:, 1]], 1), radial)
        return t, normal, uv
    cos, sin = np.cos(obj.yaw), np.sin(obj.yaw)
    to_local = np.array([[cos, 0, -sin], [0, 1, 0], [sin, 0, cos]])  # world -> box frame (rotation about y)
    origin, direction = to_local @ -obj.center, rays @ to_local.T
    half = np.asarray(obj.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (-half - origin) / direction, (half - origin) / direction
    t_near_axes = np.minimum(t1, t2)
    near, far = t_near_axes.max(1), np.maximum(t1, t2).min(1)
    t = np.where((near <= far) & (near > 1e-6), near, np.inf)
    axis = t_near_axes.argmax(1)
    local_normal = np.zeros_like(direction)
    local_normal[np.arange(len(t)), axis] = -np.sign(direction[np.arange(len(t)), axis])
    local_point = origin + direction * np.where(np.isfinite(t), t, 0)[:, None]
    uv = np.where(
        axis[:, None] == 1,
        local_point[:, [0, 2]],
        np.stack([local_point[:, 0] + local_point[:, 2], local_point[:, 1]], 1),
    )
    return t, local_normal @ to_local, uv


def _albedo(material: Material, uv: np.ndarray) -> np.ndarray:
    u = uv[:, 0] * np.cos(material.angle) + uv[:, 1] * np.sin(material.angle)
    v = -uv[:, 0] * np.sin(material.angle) + uv[:, 1] * np.cos(material.angle)
    if material.pattern == "stripes":
        s = 0.5 + 0.5 * np.sin(2 * np.pi * material.frequency * u)
    else:
        s = (np.floor(material.frequency * u) + np.floor(material.frequency * v)) % 2
    return material.base * (1 - s[:, None]) + material.accent * s[:, None]


def render_scene(scene: Scene, config: SceneConfig, rng: np.random.Generator | None = None) -> RenderedScene:
    """Ray-cast ``scene``; ``rng`` draws the sensor noise (none without it)."""
    size = config.image_size
    rays = camera_rays(config, scene.pitch)
    floor_y = -scene.camera_height
    surfaces = [  # (t, normal, uv, class, material)
        (_plane_hits(rays, 1, floor_y), np.array([0.0, 1.0, 0.0]), None, FLOOR, scene.floor),
        (_plane_hits(rays, 2, scene.room_depth), np.array([0.0, 0.0, -1.0]), None, WALL, scene.wall),
        (_plane_hits(rays, 0, -scene.room_half_width), np.array([1.0, 0.0, 0.0]), None, WALL, scene.wall),
        (_plane_hits(rays, 0, scene.room_half_width), np.array([-1.0, 0.0, 0.0]), None, WALL, scene.wall),
    ]
    surfaces += [(*_intersect_culled(obj, rays), obj.kind, obj.material) for obj in scene.objects]
    hits = np.stack([s[0] for s in surfaces])
    nearest = hits.argmin(0)
    depth = hits[nearest, np.arange(len(rays))]
    points = rays * depth[:, None]
    semseg = np.zeros(len(rays), dtype=np.uint8)
    normals = np.zeros_like(rays)
    albedo = np.zeros_like(rays)
    plane_axes = ([0, 2], [0, 1], [2, 1], [2, 1])  # texture coordinates of the floor, back wall, side walls
    order = np.argsort(nearest, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(nearest, minlength=len(surfaces)))])
    for index, (_, normal, uv, kind, material) in enumerate(surfaces):
        pixels = order[bounds[index] : bounds[index + 1]]
        if not len(pixels):
            continue
        semseg[pixels] = kind
        normals[pixels] = normal[pixels] if uv is not None else normal
        albedo[pixels] = _albedo(material, uv[pixels] if uv is not None else points[pixels][:, plane_axes[index]])
    for decal in scene.decals:
        if decal.kind == RUG:
            covered = (nearest == 0) & (
                np.hypot(points[:, 0] - decal.center[0], points[:, 2] - decal.center[1]) <= decal.size[0]
            )
            uv = points[:, [0, 2]]
        else:
            covered = (
                (nearest == 1)
                & (np.abs(points[:, 0] - decal.center[0]) <= decal.size[0])
                & (np.abs(points[:, 1] - decal.center[1]) <= decal.size[1])
            )
            uv = points[:, [0, 1]]
        semseg[covered] = decal.kind
        albedo[covered] = _albedo(decal.material, uv[covered])
    shading = 0.35 + 0.65 * np.clip(normals @ scene.light, 0.0, None)
    rgb = albedo * shading[:, None]
    if rng is not None and config.noise_std > 0:
        rgb = rgb + rng.normal(0.0, config.noise_std, rgb.shape)
    return RenderedScene(
        rgb=np.clip(rgb, 0.0, 1.0).reshape(size, size, 3).astype(np.float32),
        depth=depth.reshape(size, size).astype(np.float32),
        semseg=semseg.reshape(size, size),
    )


def dominant_object_label(semseg: np.ndarray) -> int | None:
    """Index into :data:`LABEL_NAMES` of the object class covering the most pixels (None if no object is seen)."""
    counts = np.array([(semseg == c).sum() for c in OBJECT_CLASSES])
    return int(counts.argmax()) if counts.max() > 0 else None


def scene_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``split``: distinct splits never share a scene."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split), index]))


def render_example(seed: int, split: str, index: int, config: SceneConfig) -> tuple[RenderedScene, int]:
    """Scene ``index`` of ``split`` rendered, with its label (scenes where no object is seen are redrawn)."""
    rng = scene_rng(seed, split, index)
    while True:
        rendered = render_scene(sample_scene(rng, config), config, rng)
        label = dominant_object_label(rendered.semseg)
        if label is not None:
            return rendered, label


def generate_scenes(num_images: int, split: str = "train", seed: int = 0, config: SceneConfig | None = None):
    """A ``datasets.Dataset`` of ``num_images`` scenes: ``id`` (str), ``rgb`` (RGB image), ``depth`` (16-bit PNG,
    millimetres, the NYUv2 convention; 0 = invalid never occurs here), ``semseg`` (8-bit class ids,
    ``CLASS_NAMES``), ``label`` (``ClassLabel`` over ``LABEL_NAMES``, the dominant object)."""
    import datasets
    from PIL import Image

    config = config or SceneConfig()
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    columns: dict[str, list] = {"id": [], "rgb": [], "depth": [], "semseg": [], "label": []}
    for index in range(num_images):
        rendered, label = render_example(seed, split, index, config)
        columns["id"].append(f"{split}-{seed}-{index:06d}")
        columns["rgb"].append(Image.fromarray(np.round(rendered.rgb * 255).astype(np.uint8)))
        columns["depth"].append(Image.fromarray(np.round(rendered.depth * 1000).astype(np.uint16)))
        columns["semseg"].append(Image.fromarray(rendered.semseg))
        columns["label"].append(label)
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "rgb": datasets.Image(),
            "depth": datasets.Image(),
            "semseg": datasets.Image(),
            "label": datasets.ClassLabel(names=list(LABEL_NAMES)),
        }
    )
    description = (
        f"robust_pretrain procedural scenes v{GENERATOR_VERSION}: split={split} seed={seed} "
        f"n={num_images} config={asdict(config)}; semseg classes {list(CLASS_NAMES)}"
    )
    info = datasets.DatasetInfo(description=description, features=features)
    return datasets.Dataset.from_dict(columns, features=features, info=info, split=split)


def subpatch_variance_fraction(images: np.ndarray, patch_size: int) -> float:
    """Share of an image stack's variance below the patch scale: ``E|x - patchmean(x)|^2 / Var(x)``.

    ``images``: (N, H, W, C) floats (one-hot for class maps). 0 = each patch is constant (its reconstruction
    follows from coarse context), 1 = nothing is shared within a patch. A modality-agnostic, unit-free measure of
    how much detail a masked patch hides, used to compare the difficulty of the modalities.
    """
    n, height, width, channels = images.shape
    grid = images[:, : height - height % patch_size, : width - width % patch_size]
    blocks = grid.reshape(n, height // patch_size, patch_size, width // patch_size, patch_size, channels)
    residual = blocks - blocks.mean(axis=(2, 4), keepdims=True)
    return float((residual**2).mean() / grid.reshape(-1, channels).var(axis=0).mean())
