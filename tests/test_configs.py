"""The demo configs ship with the package and are addressable by name (``--config demo``); a file path still wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import robust_pretrain
from robust_pretrain.cli import UsageError
from robust_pretrain.config import load_config_file
from robust_pretrain.configs import packaged_configs, resolve_config

PACKAGE = Path(robust_pretrain.__file__).resolve().parent
RECIPE_CONFIGS = PACKAGE.parent / "recipes" / "configs"
NAMES = ["decoder_demo", "demo", "evidence_minilm", "glue_finetune", "glue_suite_local", "vision_demo"]


def test_packaged_configs_are_the_one_source_of_the_recipe_configs():
    packaged = packaged_configs()
    assert sorted(packaged) == NAMES
    for name, path in packaged.items():
        assert path.parent.resolve() == PACKAGE / "configs" and path.read_text().startswith("#")
        link = RECIPE_CONFIGS / f"{name}.yaml"
        assert link.is_symlink() and not Path(link.readlink()).is_absolute()  # relative: survives a move of the clone
        assert link.resolve() == path.resolve()
    assert sorted(p.stem for p in RECIPE_CONFIGS.glob("*.yaml")) == NAMES


def test_a_bare_name_is_a_packaged_config_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config("vision_demo") == packaged_configs()["vision_demo"]
    assert load_config_file("demo") == yaml.safe_load((PACKAGE / "configs" / "demo.yaml").read_text())
    assert "ud_dir" not in load_config_file("demo")  # left to --ud_dir / $ROBUST_PRETRAIN_UD_DIR / the default


def test_an_existing_file_wins_over_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("demo").write_text("max_steps: 7\n")
    assert resolve_config("demo") == Path("demo")
    assert load_config_file("demo") == {"max_steps": 7}
    assert resolve_config(str(RECIPE_CONFIGS / "demo.yaml")) == RECIPE_CONFIGS / "demo.yaml"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "dmeo",
            "--config dmeo: is neither a file nor a packaged config (did you mean demo? packaged configs: "
            "decoder_demo, demo, ",
        ),
        (
            "nothing",
            "--config nothing: is neither a file nor a packaged config (packaged configs: decoder_demo, demo, ",
        ),
        (
            "demo.yaml",
            "--config demo.yaml: config file not found (packaged configs: decoder_demo, demo, ",
        ),  # a suffix: a path
        (
            "configs/demo",
            "--config configs/demo: config file not found (packaged configs: decoder_demo, demo, ",
        ),  # a slash: a path
        ("", "--config : config file not found (packaged configs: decoder_demo, demo, "),
    ],
)
def test_an_unknown_name_or_missing_file_is_one_line_naming_the_option_and_the_names(value, message, tmp_path):
    with pytest.raises(UsageError) as error:
        resolve_config(str(tmp_path / value) if "/" in value else value)
    text = str(error.value).replace(f"{tmp_path}/", "")
    assert text.startswith(message) and text.endswith("vision_demo)") and "\n" not in text


@pytest.mark.slow
def test_the_pos_mlm_demo_by_name_reaches_the_data_and_names_where_it_looked(tmp_path, monkeypatch, capsys):
    """From an empty directory without the shared data: the packaged demo is read (its options are accepted), and the
    run stops at the missing UD-EWT folder, named relative to the current directory, not to the package."""
    from robust_pretrain.data.corpus import UD_DIR_ENV
    from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(UD_DIR_ENV, raising=False)
    assert pos_mlm.main(["--config", "demo", "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    expected = (
        f"--ud_dir: UD English-EWT folder not found: {tmp_path.parent / 'shared' / 'data' / 'ud_ewt'} (the default"
    )
    assert len(err.splitlines()) == 1 and expected in err and f"${UD_DIR_ENV}" in err
    assert str(PACKAGE) not in err and str(PACKAGE.parent) not in err
    assert not list(tmp_path.rglob("*.safetensors"))


@pytest.mark.parametrize("prog", ["multimae", "pos_mlm"])
def test_the_recipes_refuse_an_unknown_config_name_with_exit_status_2(prog, tmp_path, monkeypatch, capsys):
    import importlib

    recipe = importlib.import_module(f"robust_pretrain.pretraining.{prog}.recipe")
    monkeypatch.chdir(tmp_path)
    assert recipe.main(["--config", "vision_dem", "--output_dir", "out"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--config vision_dem: " in err and "did you mean vision_demo?" in err
    assert not (tmp_path / "out").exists()
