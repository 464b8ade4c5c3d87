"""End-to-end tests of the MM-MAE pre-training recipe (``robust_pretrain.pretraining.multimae.recipe``, run as
``recipes/pretrain_multimae.py``; GitHub issue 8, item 7) and of ``compare`` on the vision config, on tiny budgets.

The recipe runs in-process where one process suffices; subprocesses for two processes and for the SIGKILL resume.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image
from ports import free_port
from processes import checkout_env, wait_for_checkpoint
from safetensors.torch import load_file
from test_recipe_pretrain import DEMO_CONFIG, assert_png, single_thread

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining import compare
from robust_pretrain.pretraining.multimae import recipe
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.scenes import NUM_CLASSES, SceneConfig, generate_scenes

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPE = REPO_ROOT / "recipes" / "pretrain_multimae.py"
VISION_CONFIG = REPO_ROOT / "recipes" / "configs" / "vision_demo.yaml"
MODALITIES = ["rgb", "depth", "semseg"]
IMAGE, PATCH, VISIBLE, EVAL_IMAGES, EVAL_SEED = 16, 4, 8, 4, 1234
# Tiny budget on top of the vision demo config.
TINY = [
    "--image_size", str(IMAGE), "--patch_size", str(PATCH), "--scene_size", str(IMAGE),
    "--num_train_scenes", "8", "--num_eval_scenes", str(EVAL_IMAGES), "--num_visible_tokens", str(VISIBLE),
    "--max_steps", "3", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2",
    "--logging_steps", "1", "--warmup_steps", "0", "--save_steps", "100", "--num_reconstructions", "2",
    "--disable_tqdm", "true", "--seed", "3",
]  # fmt: skip


def argv(output_dir: Path, *extra: str) -> list[str]:
    return ["--config", str(VISION_CONFIG), *TINY, "--output_dir", str(output_dir), *extra]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


# ---------------------------------------------------------------------------------- 1. one process, pushed
@pytest.fixture(scope="module")
def pushed_run(tmp_path_factory) -> tuple[Path, dict[str, bytes], str, dict[str, torch.Tensor]]:
    """One tiny run on generated scenes, pushed to a local Hub: (output dir, the Hub repo's files, repo id, the
    weights of the model loaded from the Hub by repo id)."""
    from local_hub import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer, use_local_hub
    from transformers import AutoModelForPreTraining

    output_dir = tmp_path_factory.mktemp("multimae") / "run"
    repo_id = f"{DEFAULT_USER}/tiny-multimae"
    push = ["--push_to_hub", "true", "--hub_model_id", repo_id, "--hub_token", DEFAULT_TOKEN, "--hub_strategy", "end"]
    with single_thread(), LocalHubServer() as hub, use_local_hub(hub.endpoint):
        recipe.run(argv(output_dir, *push))
        files = hub.files(repo_id)
        from_hub = AutoModelForPreTraining.from_pretrained(repo_id, cache_dir=output_dir.parent / "cache").state_dict()
    return output_dir, files, repo_id, from_hub


@pytest.mark.slow
def test_outputs_load_without_remote_code(pushed_run) -> None:
    from transformers import AutoImageProcessor, AutoModelForPreTraining

    output_dir, remote, _, from_hub = pushed_run
    for name in (
        "model.safetensors",
        "config.json",
        "preprocessor_config.json",
        "task_report.json",
        "task_weights.png",
        "reconstructions.png",
        "README.md",
    ):
        assert (output_dir / name).is_file(), name
        assert remote[name] == (output_dir / name).read_bytes(), name  # pushed as written
    assert not any(path.startswith("checkpoint-") for path in remote)
    model = AutoModelForPreTraining.from_pretrained(output_dir)
    processor = AutoImageProcessor.from_pretrained(output_dir)
    assert type(model).__name__ == "MultiMAEForPreTraining" and model.config.task_names == MODALITIES
    assert type(processor).__name__ == "MultiMAEImageProcessor" and processor.size == {"height": IMAGE, "width": IMAGE}
    assert processor.num_classes == NUM_CLASSES and model.config.modality("semseg").num_classes == NUM_CLASSES
    saved = load_file(output_dir / "model.safetensors")
    assert len(saved) > 50 and all(torch.equal(tensor, model.state_dict()[k]) for k, tensor in saved.items())
    assert all(torch.equal(tensor, from_hub[k]) for k, tensor in saved.items())
    state = read_json(output_dir / "trainer_state.json")
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert_png(output_dir / "task_weights.png")
    assert_png(output_dir / "reconstructions.png")
    with Image.open(output_dir / "reconstructions.png") as image:  # 5 columns; 2 images x 3 modalities = 6 rows
        width, height = image.size
    assert 800 < width < 950 and height > 6 * 160


@pytest.mark.slow
def test_report_is_the_held_out_loss_on_the_fixed_masks(pushed_run) -> None:
    """Recomputed independently: the saved model and processor on the held-out scenes (resized, one batch), masked by
    a collator with the evaluation seed, give the report's per-modality losses; mean and worst follow from them."""
    from transformers import AutoImageProcessor, AutoModelForPreTraining

    output_dir = pushed_run[0]
    report = read_json(output_dir / "task_report.json")
    model = AutoModelForPreTraining.from_pretrained(output_dir).eval()
    processor = AutoImageProcessor.from_pretrained(output_dir)
    scenes = generate_scenes(EVAL_IMAGES, "test", 0, SceneConfig(image_size=IMAGE))
    rows = [{**processor.process_example({m: row[m] for m in MODALITIES}), "id": row["id"]} for row in scenes]
    batch = ModalityMaskCollator(VISIBLE, PATCH, seed=EVAL_SEED)(rows)
    with torch.no_grad():
        expected = {name: float(loss) for name, loss in model(**batch).task_losses.items()}
    assert report["tasks"] == MODALITIES
    assert report["eval_task_loss"] == pytest.approx(expected, rel=1e-5)
    assert report["eval_mean_task_loss"] == pytest.approx(sum(expected.values()) / 3, rel=1e-5)
    assert report["eval_worst_task_loss"] == pytest.approx(max(expected.values()), rel=1e-5)
    assert report["worst_task"] == max(expected, key=expected.get)
    assert report["train_steps"] == 3 and report["settings"]["num_visible_tokens"] == VISIBLE
    assert sum(report["final_weights"].values()) == pytest.approx(1.0, abs=1e-5)


def test_card_lists_the_modalities(pushed_run) -> None:
    output_dir, _, repo_id, _ = pushed_run
    card = ModelCard.load(output_dir / "README.md")
    report = read_json(output_dir / "task_report.json")
    assert "robust-pretrain" in card.data.tags and "weighting-minimax" in card.data.tags
    assert card.data.pipeline_tag == "image-feature-extraction"
    for name, kind, channels, loss in (
        ("rgb", "rgb", "3", "MSE on per-patch normalised pixels"),
        ("depth", "depth", "1", "L1 on valid pixels (per-image standardised depth, cap 10 m)"),
        ("semseg", "semseg", f"{NUM_CLASSES} classes", "cross-entropy (ignore index 255)"),
    ):
        row = f"| {name} | {kind} | {channels} | {loss} | {report['final_weights'][name]:.4f} |"
        assert f"{row} {report['eval_task_loss'][name]:.4f} |" in card.text
    assert "![Held-out reconstructions](reconstructions.png)" in card.text
    assert "8 procedural indoor scenes" in card.text and "4 other scenes" in card.text
    assert f'from_pretrained("{repo_id}")' in card.text


def test_resume_refuses_other_settings(pushed_run) -> None:
    output_dir = pushed_run[0]
    with pytest.raises(UsageError, match=r"holds a run with other settings \(mask_alpha: 1\.0 -> 0\.5\)"):
        recipe.run(argv(output_dir, "--mask_alpha", "0.5", "--max_steps", "4"))


# ------------------------------------------------------------------------------------------ 2. two processes


@pytest.mark.slow
def test_two_processes_train_as_one_with_the_same_global_batch(tmp_path: Path) -> None:
    """2 gloo processes x 2 images per step compute what 1 process x 4 images computes: same crops and masks (keyed
    by image id), per-task losses pooled exactly over processes; the parameters agree to float rounding."""
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    two, one = tmp_path / "two", tmp_path / "one"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), str(RECIPE),
        *argv(two, "--per_device_train_batch_size", "2", "--weighting", "minimax"),
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recipe.run(argv(one, "--per_device_train_batch_size", "4", "--weighting", "minimax"))
    reports = {name: read_json(d / "task_report.json") for name, d in (("two", two), ("one", one))}
    assert reports["two"]["settings"]["processes"] == 2 and reports["one"]["settings"]["processes"] == 1
    assert reports["two"]["eval_task_loss"] == pytest.approx(reports["one"]["eval_task_loss"], rel=1e-4)
    assert reports["two"]["final_weights"] == pytest.approx(reports["one"]["final_weights"], rel=1e-4)
    expected, got = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
    assert (two / "reconstructions.png").is_file() and ModelCard.load(two / "README.md").text.count(
        "| processes | 2 |"
    ) == 1


# ------------------------------------------------------------------------------------ 3. SIGKILL and rerun
@pytest.mark.slow
def test_killed_and_rerun_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    """12 scenes in batches of 4: 3 steps per epoch, so the kill lands in the second epoch (new crops and masks) and
    the rerun resumes mid-run; its parameters are bit-identical to an uninterrupted run's."""
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    steps = 8

    def command(output_dir: Path) -> list[str]:
        return [
            sys.executable,
            str(RECIPE),
            *argv(
                output_dir,
                "--num_train_scenes",
                "12",
                "--max_steps",
                str(steps),
                "--save_steps",
                "1",
                "--num_reconstructions",
                "0",
            ),
        ]

    reference_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    with open(tmp_path / "reference.log", "w") as log, open(tmp_path / "killed.log", "w") as killed_log:
        reference = subprocess.Popen(command(reference_dir), env=env, stdout=log, stderr=subprocess.STDOUT)
        killed = subprocess.Popen(command(resumed_dir), env=env, stdout=killed_log, stderr=subprocess.STDOUT)
        try:
            wait_for_checkpoint(killed, resumed_dir / "checkpoint-4", tmp_path / "killed.log", timeout=300)
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait()
        assert reference.wait(timeout=600) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    assert killed.returncode == -9 and not (resumed_dir / "model.safetensors").exists()
    done = max(int(p.name.split("-")[1]) for p in resumed_dir.glob("checkpoint-*"))
    assert 4 <= done < steps
    rerun = subprocess.run(command(resumed_dir), env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"Resuming from checkpoint {resumed_dir}/checkpoint-" in rerun.stdout + rerun.stderr

    def losses(output_dir: Path) -> list[float]:
        return [e["loss"] for e in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in e]

    assert len(losses(reference_dir)) == steps and losses(resumed_dir) == losses(reference_dir)
    expected, resumed = load_file(reference_dir / "model.safetensors"), load_file(resumed_dir / "model.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    assert (
        read_json(resumed_dir / "task_report.json")["eval_task_loss"]
        == read_json(reference_dir / "task_report.json")["eval_task_loss"]
    )


# --------------------------------------------------------------------------------------------- 4. bad input
def write_folder(root: Path, split: str, stems: list[str], modalities=("rgb", "depth", "semseg"), size=IMAGE) -> None:
    rng = np.random.default_rng(len(stems))
    for modality in modalities:
        (root / split / modality).mkdir(parents=True, exist_ok=True)
    for stem in stems:
        if "rgb" in modalities:
            rgb = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(root / split / "rgb" / f"{stem}.png")
        if "depth" in modalities:
            depth = rng.integers(500, 5000, (size, size)).astype(np.uint16)
            Image.fromarray(depth).save(root / split / "depth" / f"{stem}.png")
        if "semseg" in modalities:
            classes = rng.integers(0, 3, (size, size), dtype=np.uint8)
            Image.fromarray(classes).save(root / split / "semseg" / f"{stem}.png")


FOLDER = ["--num_semseg_classes", "3", "--max_steps", "2", "--num_reconstructions", "1"]


def test_missing_modality_is_an_absent_task(tmp_path: Path, caplog) -> None:
    """A folder layout without depth/ folders: depth is an absent task (no loss, weight 0); the others train."""
    root = tmp_path / "data"
    write_folder(root, "train", [f"a{i}" for i in range(8)], modalities=("rgb", "semseg"))
    write_folder(root, "test", ["b0", "b1"], modalities=("rgb", "semseg"))
    output_dir = tmp_path / "out"
    result = recipe.run(argv(output_dir, "--image_folder", str(root), *FOLDER))
    report = result["report"]
    assert report["tasks"] == MODALITIES and set(report["eval_task_loss"]) == {"rgb", "semseg"}
    assert report["final_weights"]["depth"] == 0.0
    assert report["final_weights"]["rgb"] + report["final_weights"]["semseg"] == pytest.approx(1.0, abs=1e-5)
    log = read_json(output_dir / "trainer_state.json")["log_history"]
    assert all("task_loss/depth" not in entry for entry in log) and any("task_loss/rgb" in entry for entry in log)
    assert "no ['depth'] column: absent task" in caplog.text
    assert "2 held-out images" in ModelCard.load(output_dir / "README.md").text
    # the visible budget must fit in the patches of the modalities the data have (2 x 16 here), not the configured 3
    with pytest.raises(UsageError, match="--num_visible_tokens 40 exceeds the 32 patches of the 2 modalities"):
        recipe.run(argv(tmp_path / "too_many", "--image_folder", str(root), *FOLDER, "--num_visible_tokens", "40"))


def test_datasets_dataset_with_a_column_mapping(tmp_path: Path) -> None:
    """A local ``datasets`` dataset (parquet train/test files) with other column names, mapped; a mapping to a column
    the data lack is refused by name."""
    data = tmp_path / "scenes_parquet"
    data.mkdir()
    renames = {"rgb": "image", "depth": "depth_map", "semseg": "classes", "id": "file"}
    for split, count in (("train", 8), ("test", 2)):
        scenes = generate_scenes(count, split, 5, SceneConfig(image_size=IMAGE)).rename_columns(renames)
        scenes.to_parquet(str(data / f"{split}.parquet"))
    mapping = ["--column_mapping", "rgb=image", "depth=depth_map", "semseg=classes", "id=file"]
    output_dir = tmp_path / "out"
    with pytest.raises(UsageError, match=r"^--num_semseg_classes: the semseg modality needs the number of classes"):
        recipe.run(argv(output_dir, "--dataset_name", str(data), *mapping))
    mapping += ["--num_semseg_classes", str(NUM_CLASSES)]
    report = recipe.run(argv(output_dir, "--dataset_name", str(data), *mapping, "--max_steps", "2"))["report"]
    assert set(report["eval_task_loss"]) == set(MODALITIES) and report["train_steps"] == 2
    card = ModelCard.load(output_dir / "README.md").text
    assert "The local dataset `scenes_parquet` (8 training and 2 held-out images" in card and str(tmp_path) not in card
    with pytest.raises(UsageError, match=r"--dataset_name .*scenes_parquet.*no column 'depth_mm' \(mapped to depth\)"):
        recipe.run(
            argv(
                tmp_path / "other",
                "--dataset_name",
                str(data),
                "--column_mapping",
                "rgb=image",
                "depth=depth_mm",
                "--modalities",
                "rgb",
                "depth",
            )
        )


@pytest.mark.parametrize(
    "damage, message",
    [
        ("corrupt", r"train/rgb/a3\.png: cannot read the image"),
        ("small", r"a3.*smaller than one 4x4 patch"),
        ("class", r"a3.*class ids \[7\] outside 0\.\.2"),
        ("depth", r"a3.*depth map has no valid pixel"),
        ("aspect", r"a3.*modalities have different aspect ratios"),
    ],
)
def test_bad_images_are_refused_by_name_before_training(tmp_path: Path, capsys, damage: str, message: str) -> None:
    root = tmp_path / "data"
    write_folder(root, "train", [f"a{i}" for i in range(6)])
    if damage == "corrupt":
        (root / "train" / "rgb" / "a3.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    elif damage == "small":
        write_folder(root, "train", ["a3"], size=2)
    elif damage == "class":
        Image.fromarray(np.full((IMAGE, IMAGE), 7, dtype=np.uint8)).save(root / "train" / "semseg" / "a3.png")
    elif damage == "depth":
        Image.fromarray(np.zeros((IMAGE, IMAGE), dtype=np.uint16)).save(root / "train" / "depth" / "a3.png")
    else:
        Image.fromarray(np.full((IMAGE, 2 * IMAGE), 1000, dtype=np.uint16)).save(root / "train" / "depth" / "a3.png")
    output_dir = tmp_path / "out"
    assert recipe.main(argv(output_dir, "--image_folder", str(root), *FOLDER)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("robust-pretrain-multimae: error: --image_folder") and re.search(message, err)
    assert not output_dir.exists()  # nothing written


# ------------------------------------------------------------------------------------- 5. compare, vision
@pytest.mark.slow
def test_compare_on_the_vision_config(tmp_path: Path, monkeypatch) -> None:
    """average vs minimax (alpha sweep) x 2 seeds, the vision config picked by its options; each run in-process."""
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(command, check=False, **kwargs):
        if command[:1] != [sys.executable]:  # matplotlib's font cache runs fc-list
            return real_run(command, check=check, **kwargs)
        assert command[:3] == [sys.executable, "-m", "robust_pretrain.pretraining.multimae.recipe"]
        calls.append(command)
        recipe.run(command[3:])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(compare.subprocess, "run", run)
    out = tmp_path / "compare"
    overrides = [*TINY, "--max_steps", "2", "--num_reconstructions", "0"]
    result = compare.run(
        [
            "--config",
            str(VISION_CONFIG),
            "--strategies",
            "average",
            "minimax",
            "--seeds",
            "1",
            "2",
            "--sweep",
            "alpha=0.5,4",
            "--output_dir",
            str(out),
            "--",
            *overrides,
        ]
    )
    assert list(result["runs"]) == ["average", "minimax-alpha=0.5", "minimax-alpha=4"] and len(calls) == 6
    for run_name, table in result["runs"].items():
        reports = [read_json(out / run_name / f"seed-{s}" / "task_report.json") for s in (1, 2)]
        assert set(table["task_loss"]) == set(MODALITIES) and table["seeds"] == 2
        for task in MODALITIES:
            assert table["task_loss"][task]["mean"] == pytest.approx(
                np.mean([r["eval_task_loss"][task] for r in reports]), rel=1e-12
            )
        worsts = [r["eval_worst_task_loss"] for r in reports]
        assert table["worst_task_loss"]["mean"] == pytest.approx(np.mean(worsts), rel=1e-12)
    top = {
        name: max(read_json(out / name / "seed-1" / "task_report.json")["final_weights"].values())
        for name in ("minimax-alpha=0.5", "minimax-alpha=4")
    }
    assert top["minimax-alpha=4"] > top["minimax-alpha=0.5"]
    for picture in ("comparison_tasks.png", "frontier.png"):
        assert_png(out / picture)
    assert "| semseg |" in (out / "comparison.md").read_text()


def test_compare_picks_the_recipe_of_the_config(tmp_path: Path) -> None:
    import yaml

    assert compare.recipe_for_config(yaml.safe_load(VISION_CONFIG.read_text())) == "multimae"
    assert compare.recipe_for_config(yaml.safe_load(DEMO_CONFIG.read_text())) == "pos_mlm"
    assert compare.recipe_for_config({"max_steps": 3}) == "pos_mlm"
    unknown = "{'pos_mlm': ['num_visible_tokens'], 'multimae': ['mlm_probability']}"
    with pytest.raises(
        ValueError, match=re.escape(f"no recipe takes every option of the --config file (unknown options: {unknown})")
    ):
        compare.recipe_for_config({"mlm_probability": 0.1, "num_visible_tokens": 8})


def test_the_modalities_are_the_option_else_all_three() -> None:
    """The tasks of an MM-MAE run, known after the parse (the recipe peeks at no option before it)."""
    from robust_pretrain.pretraining.multimae.arguments import ModelArguments, resolve_modalities
    from robust_pretrain.vision.multimae.image_processing_multimae import MODALITIES

    chosen = ModelArguments(modalities=["rgb", "depth"])
    assert resolve_modalities(chosen) == ["rgb", "depth"] == chosen.modalities
    assert resolve_modalities(ModelArguments()) == list(MODALITIES)
