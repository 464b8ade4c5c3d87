"""GLUE TSV parsing, Hub-identical features, task registry, config files and bad-input errors (no models)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
from glue_support import SHARED_TASKS, make_synthetic_glue, mnli_rows, write_tsv
from transformers import HfArgumentParser

from robust_pretrain.cli import UsageError
from robust_pretrain.config import parse_with_config
from robust_pretrain.glue import check_glue_files, get_task, glue_features, load_glue, primary_score, read_glue_tsv
from robust_pretrain.glue.finetune import GlueDataArguments, GlueRunArguments, GlueTrainingArguments, LoraArguments

# Schema of the Hub dataset nyu-mll/glue (column order, label names in id order), written out independently.
HUB_SCHEMA = {
    "cola": (["sentence", "label", "idx"], ["unacceptable", "acceptable"]),
    "sst2": (["sentence", "label", "idx"], ["negative", "positive"]),
    "mrpc": (["sentence1", "sentence2", "label", "idx"], ["not_equivalent", "equivalent"]),
    "stsb": (["sentence1", "sentence2", "label", "idx"], None),
    "qqp": (["question1", "question2", "label", "idx"], ["not_duplicate", "duplicate"]),
    "mnli": (["premise", "hypothesis", "label", "idx"], ["entailment", "neutral", "contradiction"]),
    "qnli": (["question", "sentence", "label", "idx"], ["entailment", "not_entailment"]),
    "rte": (["sentence1", "sentence2", "label", "idx"], ["entailment", "not_entailment"]),
    "wnli": (["sentence1", "sentence2", "label", "idx"], ["not_entailment", "entailment"]),
}
# Split sizes of the shared files (SST-2 train is a 5,000-row subset) = Hub sizes for the complete files.
SHARED_SIZES = {
    "cola": (8551, 1043),
    "sst2": (5000, 872),
    "mrpc": (3668, 408),
    "stsb": (5749, 1500),
    "rte": (2490, 277),
    "wnli": (635, 71),
}


def _hub_features(task: str) -> datasets.Features:
    columns, names = HUB_SCHEMA[task]
    label = datasets.Value("float32") if names is None else datasets.ClassLabel(names=names)
    text = {name: datasets.Value("string") for name in columns[:-2]}
    return datasets.Features({**text, "label": label, "idx": datasets.Value("int32")})


@pytest.mark.parametrize("task", list(HUB_SCHEMA))
def test_features_match_hub_schema(task: str) -> None:
    features = glue_features(task)
    assert list(features) == HUB_SCHEMA[task][0]
    assert features == _hub_features(task)


@pytest.fixture(scope="module")
def shared_glue(shared_data: Path) -> dict[str, datasets.DatasetDict]:
    return {task: load_glue(task, shared_data / "glue") for task in SHARED_TASKS}


@pytest.mark.parametrize("task", SHARED_TASKS)
def test_shared_tasks_load_with_hub_features(task: str, shared_glue: dict[str, datasets.DatasetDict]) -> None:
    splits = shared_glue[task]
    assert list(splits) == ["train", "validation"]
    assert (len(splits["train"]), len(splits["validation"])) == SHARED_SIZES[task]
    for dataset in splits.values():
        assert dataset.features == _hub_features(task)
        assert dataset["idx"] == list(range(len(dataset)))
        assert all(text.strip() for column in HUB_SCHEMA[task][0][:-2] for text in dataset[column])


def test_shared_rows_decode_to_hub_labels(shared_glue: dict[str, datasets.DatasetDict]) -> None:
    first = {task: splits["train"][0] for task, splits in shared_glue.items()}
    # CoLA: no header, sentence is the 4th column; MRPC starts with a byte-order mark and has literal quotes.
    assert first["cola"] == {
        "sentence": "Our friends won't buy this analysis, let alone the next one we propose.",
        "label": 1,
        "idx": 0,
    }
    assert first["mrpc"]["label"] == 1  # "1" = equivalent
    assert first["mrpc"]["sentence1"].startswith('Amrozi accused his brother , whom he called " the witness "')
    assert first["rte"]["label"] == 1  # not_entailment
    assert first["wnli"]["label"] == 1  # entailment
    assert first["stsb"]["label"] == pytest.approx(5.0)
    assert first["sst2"] == {"sentence": "hide new secretions from the parental units ", "label": 0, "idx": 0}
    rte_labels = shared_glue["rte"]["train"].features["label"]
    assert rte_labels.int2str(0) == "entailment"
    assert set(shared_glue["rte"]["validation"]["label"]) == {0, 1}
    assert max(shared_glue["stsb"]["validation"]["label"]) == pytest.approx(5.0)


def test_synthetic_mnli_qqp_qnli_parsers(tmp_path: Path) -> None:
    root = make_synthetic_glue(tmp_path / "glue", count=6)
    mnli = load_glue("mnli", root)
    assert list(mnli) == ["train", "validation_matched", "validation_mismatched"]
    assert len(mnli["validation_mismatched"]) == 9
    assert mnli["train"][4] == {"premise": 'premise 4 says "hi"', "hypothesis": "hypothesis 4", "label": 1, "idx": 4}
    assert mnli["validation_matched"]["label"] == [0, 1, 2, 0, 1, 2]
    qqp = load_glue("qqp", root)
    assert qqp["train"][3] == {"question1": "how do I 3?", "question2": "what is 3?", "label": 1, "idx": 3}
    qnli = load_glue("qnli", root)
    assert qnli["validation"][1] == {"question": "who is 1?", "sentence": "1 is a number.", "label": 1, "idx": 1}
    for task, splits in (("mnli", mnli), ("qqp", qqp), ("qnli", qnli)):
        assert all(dataset.features == _hub_features(task) for dataset in splits.values())


def test_cola_without_header_and_blank_lines(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "cola.tsv", [["src", "0", "*", "Bad sentence ."], [], ["src", "1", "", "Good ."]])
    dataset = read_glue_tsv("cola", path)
    assert dataset["sentence"] == ["Bad sentence .", "Good ."]
    assert dataset["label"] == [0, 1]


def test_unknown_task() -> None:
    with pytest.raises(ValueError, match="Unknown GLUE task 'squad'.*cola"):
        get_task("squad")
    assert get_task("SST-2").name == "sst2"


def test_missing_task_files_are_reported(shared_data: Path) -> None:
    with pytest.raises(UsageError, match=r"mnli: .*MNLI/train.tsv not found"):
        check_glue_files("mnli", shared_data / "glue")
    with pytest.raises(UsageError, match="qqp"):
        load_glue("qqp", shared_data / "glue")


def test_missing_column_is_reported(tmp_path: Path) -> None:
    path = write_tsv(
        tmp_path / "RTE" / "train.tsv", [["index", "sentence1", "hypothesis", "label"], ["0", "a", "b", "entailment"]]
    )
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence2'\]"):
        read_glue_tsv("rte", path)


def test_wrong_label_set_is_reported(shared_data: Path, tmp_path: Path) -> None:
    # An MNLI-style 3-way file put where RTE is expected.
    shutil.copytree(shared_data / "glue" / "RTE", tmp_path / "RTE")
    rows = [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "entailment"], ["1", "c", "d", "neutral"]]
    write_tsv(tmp_path / "RTE" / "dev.tsv", rows)
    with pytest.raises(
        ValueError, match=r"dev.tsv:3: label 'neutral' is not one of \['entailment', 'not_entailment'\]"
    ):
        load_glue("rte", tmp_path)
    write_tsv(
        tmp_path / "mrpc.tsv", [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], ["2", "1", "2", "a", "b"]]
    )
    with pytest.raises(ValueError, match="label '2'"):
        read_glue_tsv("mrpc", tmp_path / "mrpc.tsv")
    write_tsv(tmp_path / "stsb.tsv", mnli_rows(2, dev=False)[:1] + [["x"] * 11])
    with pytest.raises(ValueError, match="lacks column"):
        read_glue_tsv("stsb", tmp_path / "stsb.tsv")


def test_short_row_and_bad_score(tmp_path: Path) -> None:
    write_tsv(tmp_path / "wnli.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "only one"]])
    with pytest.raises(ValueError, match=r"wnli.tsv:2 has 2 fields, expected at least 4"):
        read_glue_tsv("wnli", tmp_path / "wnli.tsv")
    header = [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ]
    write_tsv(tmp_path / "stsb.tsv", [header, ["0", "g", "f", "y", "0", "s", "s", "a", "b", "high"]])
    with pytest.raises(ValueError, match="score 'high' is not a number"):
        read_glue_tsv("stsb", tmp_path / "stsb.tsv")


def test_hub_loading_needs_network() -> None:
    with pytest.raises(UsageError, match="no --glue_dir given and the Hub is offline"):
        load_glue("rte")


def test_primary_score_per_task() -> None:
    metrics = {"eval_matthews_correlation": 0.25, "eval_accuracy": 0.5, "eval_f1": 0.75, "eval_spearmanr": 0.8}
    assert primary_score("cola", metrics) == pytest.approx(25.0)
    assert primary_score("mrpc", metrics) == pytest.approx(75.0)
    assert primary_score("qqp", metrics) == pytest.approx(75.0)
    assert primary_score("stsb", metrics) == pytest.approx(80.0)
    assert primary_score("mnli", {"eval_accuracy": 0.6, "eval_accuracy_mm": 0.1}) == pytest.approx(60.0)
    with pytest.raises(KeyError, match="eval_matthews_correlation"):
        primary_score("cola", {"eval_accuracy": 0.5})


def _finetune_parser() -> HfArgumentParser:
    return HfArgumentParser((GlueRunArguments, GlueDataArguments, LoraArguments, GlueTrainingArguments))


def test_paper_defaults() -> None:
    run, data, lora, training = parse_with_config(
        _finetune_parser(), ["--model_name_or_path", "m", "--task_name", "rte"]
    )
    assert (training.learning_rate, training.per_device_train_batch_size, training.weight_decay) == (2e-5, 32, 0.1)
    assert (training.warmup_steps, str(training.lr_scheduler_type.value), training.num_train_epochs) == (
        0.06,
        "linear",
        3,
    )
    assert data.max_seq_length == 128
    assert (lora.use_lora, lora.lora_target_modules) == (False, ["query", "value"])


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_with_command_line_override(tmp_path: Path, suffix: str) -> None:
    config = {
        "model_name_or_path": "ckpt",
        "task_name": "mrpc",
        "learning_rate": "3e-5",
        "max_steps": 7,
        "use_lora": True,
        "lora_target_modules": ["query", "key", "value"],
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / f"config{suffix}"
    path.write_text(json.dumps(config))  # JSON is valid YAML too
    run, _, lora, training = parse_with_config(_finetune_parser(), ["--config", str(path), "--max_steps", "3"])
    assert (run.task_name, training.learning_rate, training.max_steps) == ("mrpc", 3e-5, 3)
    assert lora.use_lora and lora.lora_target_modules == ["query", "key", "value"]


def test_config_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("task_name: rte\nmodel_name_or_path: m\nlerning_rate: 1e-4\n")
    with pytest.raises(ValueError, match="lerning_rate"):
        parse_with_config(_finetune_parser(), ["--config", str(path)])
    with pytest.raises(UsageError, match="missing.yaml"):
        parse_with_config(_finetune_parser(), ["--config", str(tmp_path / "missing.yaml")])


def test_help_renders_for_both_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    from robust_pretrain.evaluation import suite
    from robust_pretrain.glue import finetune

    for main in (finetune.main, suite.main):
        with pytest.raises(SystemExit) as exit_info:
            main(["--help"])
        assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--lora_target_modules" in help_text and "--checkpoints" in help_text and "paper: 6%" in help_text
    assert "--family" in help_text and "--overwrite_output_dir" in help_text


def test_shipped_configs_parse() -> None:
    from robust_pretrain.evaluation.suite import parse_suite_args

    configs = Path(__file__).resolve().parents[1] / "recipes" / "configs"
    required = ["--model_name_or_path", "m", "--task_name", "rte"]
    _, data, _, training = parse_with_config(
        _finetune_parser(), ["--config", str(configs / "glue_finetune.yaml"), *required]
    )
    assert (training.learning_rate, training.warmup_steps, data.max_seq_length) == (2e-5, 0.06, 128)
    argv = ["--config", str(configs / "glue_suite_local.yaml"), "--checkpoints", "a", "b", "--seeds", "1"]
    suite_args, (data, _, training) = parse_suite_args(argv)
    assert suite_args.tasks == ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"] and suite_args.seeds == [1]
    assert (training.num_train_epochs, data.glue_dir) == (3, "/work/shared/data/glue")


def test_hub_path_keeps_train_and_eval_splits_and_checks_labels(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from robust_pretrain.glue import data

    local = load_glue("rte", shared_data / "glue")
    hub = datasets.DatasetDict({**local, "test": local["validation"]})
    requested = []
    monkeypatch.setattr(data.hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(data.datasets, "load_dataset", lambda *args, **kwargs: requested.append(args) or hub)
    assert list(load_glue("rte")) == ["train", "validation"]
    assert requested == [("nyu-mll/glue", "rte")]
    hub["validation"] = hub["validation"].cast_column("label", datasets.ClassLabel(names=["yes", "no"]))
    with pytest.raises(ValueError, match="nyu-mll/glue/rte validation: features"):
        load_glue("rte")
