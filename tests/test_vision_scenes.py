import math

import numpy as np
import pytest

from robust_pretrain.vision.scenes import (
    BOX,
    CYLINDER,
    FLOOR,
    LABEL_NAMES,
    NUM_CLASSES,
    PICTURE,
    RUG,
    SPHERE,
    WALL,
    Decal,
    Material,
    Primitive,
    Scene,
    SceneConfig,
    generate_scenes,
    render_example,
    render_scene,
    sample_scene,
    subpatch_variance_fraction,
)

CONFIG = SceneConfig(image_size=48)


def plain(colour) -> Material:
    colour = np.asarray(colour, dtype=float)
    return Material(colour, colour, "stripes", 3.0, 0.0)


def world_points(depth: np.ndarray, pitch: float, size: int, fov_degrees: float) -> np.ndarray:
    """Back-project z-depth to world points (H, W, 3), written independently of the renderer."""
    focal = size / 2 / math.tan(math.radians(fov_degrees) / 2)
    rows, cols = np.mgrid[0:size, 0:size] + 0.5
    x_cam, y_cam = (cols - size / 2) / focal * depth, -(rows - size / 2) / focal * depth
    # The camera pitched down by `pitch`: its optical axis is (0, -sin, cos), its up vector (0, cos, sin).
    return np.stack(
        [x_cam, y_cam * math.cos(pitch) - depth * math.sin(pitch), y_cam * math.sin(pitch) + depth * math.cos(pitch)],
        axis=-1,
    )


def single_sphere_scene(pitch: float = 0.0) -> Scene:
    sphere = Primitive(SPHERE, np.array([0.4, -1.5 + 0.5, 3.0]), (0.5,), plain([0.8, 0.2, 0.2]))
    return Scene(
        camera_height=1.5,
        pitch=pitch,
        room_depth=6.0,
        room_half_width=3.0,
        light=np.array([0.0, 1.0, 0.0]),
        floor=plain([0.5, 0.5, 0.5]),
        wall=plain([0.3, 0.6, 0.9]),
        objects=[sphere],
    )


def test_sphere_pixels_have_the_analytic_depth_and_class():
    scene = single_sphere_scene()
    rendered = render_scene(scene, CONFIG)
    size = CONFIG.image_size
    focal = size / 2 / math.tan(math.radians(CONFIG.fov_degrees) / 2)
    center, radius = scene.objects[0].center, 0.5
    hit_depth = np.full((size, size), np.inf)
    for row in range(size):
        for col in range(size):
            ray = np.array([(col + 0.5 - size / 2) / focal, -(row + 0.5 - size / 2) / focal, 1.0])
            roots = np.roots([ray @ ray, -2 * ray @ center, center @ center - radius**2])
            real = roots[np.isreal(roots)].real
            if len(real):
                hit_depth[row, col] = real.min()  # z-depth: the ray's z component is 1
    on_sphere = np.isfinite(hit_depth)
    assert on_sphere.sum() > 50
    assert np.array_equal(rendered.semseg == SPHERE, on_sphere)  # nothing occludes it in this scene
    assert np.allclose(rendered.depth[on_sphere], hit_depth[on_sphere], atol=1e-4)


def test_shading_follows_the_surface_normal():
    # Uniform albedos, light from straight above, no noise: rgb = albedo * (0.35 + 0.65 * max(0, n_y)).
    scene = single_sphere_scene(pitch=math.radians(15))
    rendered = render_scene(scene, CONFIG)
    points = world_points(rendered.depth, scene.pitch, CONFIG.image_size, CONFIG.fov_degrees)
    sphere = rendered.semseg == SPHERE
    normal_y = (points[..., 1] - scene.objects[0].center[1]) / 0.5
    expected = np.array([0.8, 0.2, 0.2]) * (0.35 + 0.65 * np.clip(normal_y, 0, None))[..., None]
    assert np.allclose(rendered.rgb[sphere], expected[sphere], atol=1e-4)
    floor = rendered.semseg == FLOOR
    assert np.allclose(rendered.rgb[floor], 0.5, atol=1e-6)  # normal (0, 1, 0): fully lit
    walls = rendered.semseg == WALL
    assert np.allclose(rendered.rgb[walls], np.array([0.3, 0.6, 0.9]) * 0.35, atol=1e-6)  # vertical: ambient only


@pytest.mark.parametrize("index", range(6))
def test_every_pixel_lies_on_the_surface_its_class_names(index):
    rng = np.random.default_rng(index)
    scene = sample_scene(rng, CONFIG)
    rendered = render_scene(scene, CONFIG, rng)
    points = world_points(rendered.depth, scene.pitch, CONFIG.image_size, CONFIG.fov_degrees)
    x, y, z = points[..., 0], points[..., 1], points[..., 2]
    classes = rendered.semseg
    floorlike = (classes == FLOOR) | (classes == RUG)
    assert np.allclose(y[floorlike], -scene.camera_height, atol=1e-4)  # the floor plane
    walls = (classes == WALL) | (classes == PICTURE)
    on_a_wall = np.isclose(z, scene.room_depth, atol=1e-4) | np.isclose(np.abs(x), scene.room_half_width, atol=1e-4)
    assert on_a_wall[walls].all()
    on_object = np.zeros_like(classes, dtype=bool)
    for obj in scene.objects:
        if obj.kind == SPHERE:
            surface = np.isclose(np.linalg.norm(points - obj.center, axis=-1), obj.size[0], atol=1e-4)
        elif obj.kind == CYLINDER:
            radius, height = obj.size
            radial = np.hypot(x - obj.center[0], z - obj.center[2])
            within_height = (y >= obj.center[1] - 1e-4) & (y <= obj.center[1] + height + 1e-4)
            side = np.isclose(radial, radius, atol=1e-4) & within_height
            top = np.isclose(y, obj.center[1] + height, atol=1e-4) & (radial <= radius + 1e-4)
            surface = side | top
        else:
            cos, sin = math.cos(obj.yaw), math.sin(obj.yaw)
            offset = points - obj.center
            local = np.stack(
                [
                    cos * offset[..., 0] - sin * offset[..., 2],
                    offset[..., 1],
                    sin * offset[..., 0] + cos * offset[..., 2],
                ],
                axis=-1,
            ) / np.asarray(obj.size)
            surface = np.isclose(np.abs(local).max(axis=-1), 1.0, atol=1e-4)
        on_object |= surface & (classes == obj.kind)
    objects = np.isin(classes, [BOX, SPHERE, CYLINDER])
    assert on_object[objects].all()
    assert set(np.unique(classes)) <= set(range(NUM_CLASSES))


def test_distractors_change_the_class_but_not_the_depth():
    scene = single_sphere_scene()
    plain_render = render_scene(scene, CONFIG)
    scene.decals = [
        Decal(RUG, np.array([-0.8, 2.5]), (0.5,), plain([0.9, 0.1, 0.9])),
        Decal(PICTURE, np.array([0.0, 0.8]), (0.6, 0.3), plain([0.1, 0.9, 0.1])),
    ]
    with_decals = render_scene(scene, CONFIG)
    assert np.array_equal(plain_render.depth, with_decals.depth)
    assert (with_decals.semseg == RUG).sum() > 10 and (with_decals.semseg == PICTURE).sum() > 10
    assert np.allclose(with_decals.rgb[with_decals.semseg == RUG], [0.9, 0.1, 0.9], atol=1e-6)


def test_dataset_columns_labels_and_deterministic_fingerprint():
    config = SceneConfig(image_size=32)
    dataset = generate_scenes(12, split="train", seed=3, config=config)
    again = generate_scenes(12, split="train", seed=3, config=config)
    assert dataset._fingerprint == again._fingerprint
    assert dataset.column_names == ["id", "rgb", "depth", "semseg", "label"]
    assert dataset.features["label"].names == list(LABEL_NAMES)
    row = dataset[5]
    assert row["id"] == "train-3-000005"
    assert row["rgb"].mode == "RGB" and row["rgb"].size == (32, 32)
    assert row["depth"].mode == "I;16" and row["semseg"].mode == "L"
    rendered, label = render_example(3, "train", 5, config)
    assert np.array_equal(np.asarray(row["depth"]), np.round(rendered.depth * 1000).astype(np.uint16))
    assert np.array_equal(np.asarray(row["semseg"]), rendered.semseg)
    for example in dataset:
        semseg = np.asarray(example["semseg"])
        counts = [(semseg == c).sum() for c in (BOX, SPHERE, CYLINDER)]
        assert example["label"] == int(np.argmax(counts)) and max(counts) > 0
    assert generate_scenes(12, split="train", seed=4, config=config)._fingerprint != dataset._fingerprint


def test_splits_hold_different_scenes():
    config = SceneConfig(image_size=16)
    images = {
        split: {np.asarray(r["depth"]).tobytes() for r in generate_scenes(8, split=split, config=config)}
        for split in ("train", "test", "downstream_train", "downstream_test")
    }
    assert all(len(v) == 8 for v in images.values())
    splits = list(images)
    assert all(not images[a] & images[b] for i, a in enumerate(splits) for b in splits[i + 1 :])


def test_rgb_is_the_modality_with_most_subpatch_detail():
    rendered = [render_example(0, "train", i, CONFIG)[0] for i in range(24)]
    rgb = np.stack([r.rgb for r in rendered])
    depth = np.stack([r.depth for r in rendered])[..., None]
    semseg = np.eye(NUM_CLASSES)[np.stack([r.semseg for r in rendered])]
    fractions = {
        name: subpatch_variance_fraction(images, 8)
        for name, images in (("rgb", rgb), ("depth", depth), ("semseg", semseg))
    }
    assert fractions["rgb"] > 1.5 * fractions["semseg"] and fractions["semseg"] > 1.5 * fractions["depth"]
    constant = np.ones((2, 8, 8, 1)) * np.arange(2)[:, None, None, None]
    assert subpatch_variance_fraction(constant, 4) == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: generate_scenes(2, split="validation"), "unknown split 'validation'"),
        (lambda: generate_scenes(0), "num_images must be >= 1"),
        (lambda: SceneConfig(image_size=4), "image_size must be >= 8"),
    ],
)
def test_bad_arguments_are_reported(call, message):
    with pytest.raises(ValueError, match=message):
        call()
