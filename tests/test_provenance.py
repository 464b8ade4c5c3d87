"""One provenance schema for every recipe (issue 29 item 2): what each report records, the one comparison (an entry
the input lacks is a difference; ``--reference_mismatch_ok NAME`` overrides by name) and its refusals on the command
line: exit status 2, one line naming the option, the entries and the override, no traceback, nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from datasets import Dataset, concatenate_datasets
from test_recipe_causal_lm import DOMAINS, recipe_argv, write_domain_files
from test_recipe_pretrain import DEMO_CONFIG, TASKS
from tiny_causal_lm import tiny_llama

from robust_pretrain.cli import UsageError
from robust_pretrain.data import load_ewt_corpus
from robust_pretrain.data.bpe import train_bpe_tokenizer
from robust_pretrain.data.domains import ewt_genre_texts
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.pretraining.multimae import recipe as multimae
from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm
from robust_pretrain.pretraining.pos_mlm.model import train_wordpiece_tokenizer
from robust_pretrain.reference import (
    PROVENANCE_ENTRIES,
    Provenance,
    check_override,
    check_provenance,
    check_reference_model,
    dataset_fingerprint,
    model_size,
    tokenizer_fingerprint,
)

SHA_A, SHA_B = "a" * 64, "b" * 64


def provenance(**changes: object) -> Provenance:
    values = {
        "tasks": ["web", "code"],
        "tokenizer": {"name": "gpt2", "sha256": SHA_A},
        "training_data": SHA_A,
        "held_out_data": SHA_A,
        "model_size": {"layers": 2, "parameters": 1000},
    }
    return Provenance(**{**values, **changes})


def test_a_reference_model_is_checked_by_its_tokenizers_fingerprint_not_its_vocabulary_size(tmp_path) -> None:
    """Issue 39: a reference model with another tokenizer of the same vocabulary size reads the same ids as other
    text: refused by the SHA-256 of the tokenizer (from its report's provenance, else the tokenizer saved beside it),
    as is a reference that records none; ``--reference_mismatch_ok tokenizer`` overrides."""
    from test_recipe_pretrain import MINILM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MINILM))
    same, swapped, recorded, bare = (tmp_path / name for name in ("same", "swapped", "recorded", "bare"))
    tokenizer.save_pretrained(same)
    tokenizer.save_pretrained(swapped)
    definition = json.loads((swapped / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    vocab["the"], vocab["cat"] = vocab["cat"], vocab["the"]  # the same size; two ids now read as the other word
    (swapped / "tokenizer.json").write_text(json.dumps(definition))
    assert len(AutoTokenizer.from_pretrained(str(swapped))) == len(tokenizer)
    check_reference_model(str(same), tokenizer, allowed=[])
    with pytest.raises(UsageError, match=f"--reference_model {swapped}: its tokenizer .sha256 [0-9a-f]{{12}}. differs"):
        check_reference_model(str(swapped), tokenizer, allowed=[])
    for folder in (recorded, bare):
        folder.mkdir()
    report = {"provenance": {"tokenizer": {"name": "bpe", "sha256": SHA_B}}}
    (recorded / "task_report.json").write_text(json.dumps(report))
    with pytest.raises(UsageError, match=f"--reference_model {recorded}: its tokenizer .sha256 bbbbbbbbbbbb. differs"):
        check_reference_model(str(recorded), tokenizer, allowed=[])
    report["provenance"]["tokenizer"]["sha256"] = tokenizer_fingerprint(tokenizer)
    (recorded / "task_report.json").write_text(json.dumps(report))
    check_reference_model(str(recorded), tokenizer, allowed=[])
    with pytest.raises(UsageError, match=f"--reference_model {bare}: records no tokenizer"):
        check_reference_model(str(bare), tokenizer, allowed=[])
    check_reference_model(str(bare), tokenizer, allowed=["tokenizer"])
    check_reference_model(str(swapped), tokenizer, allowed=["tokenizer"])


# ------------------------------------------------------------------------------------------- the comparison
def test_every_recorded_entry_equal_is_no_difference_whatever_else_is_recorded() -> None:
    ours = provenance()
    recorded = {**ours.to_dict(), "steps": 300, "objective": "group_dro"}  # a weights file's extra keys
    assert set(ours.to_dict()) == set(PROVENANCE_ENTRIES)
    assert ours.differences(recorded) == []
    moved = {**ours.to_dict(), "tokenizer": {"name": "/elsewhere/gpt2", "sha256": SHA_A}}
    assert ours.differences(moved) == []  # a tokenizer is its definition, not the path it was loaded from


@pytest.mark.parametrize("entry", PROVENANCE_ENTRIES)
def test_an_entry_that_differs_or_is_not_recorded_is_a_difference(entry: str) -> None:
    ours = provenance()
    other = {"tasks": ["web"], "tokenizer": {"name": "gpt2", "sha256": SHA_B}, "model_size": {"layers": 4}}
    changed = {**ours.to_dict(), entry: other.get(entry, SHA_B)}
    lacking = {name: value for name, value in ours.to_dict().items() if name != entry}
    assert ours.differences(changed) == [entry]
    assert ours.differences(lacking) == [entry]
    assert ours.differences(changed, allowed=[entry]) == ours.differences(lacking, allowed=[entry]) == []


def test_none_recorded_differs_in_every_entry_and_a_recorded_none_matches_none() -> None:
    assert provenance().differences(None) == provenance().differences("garbage") == list(PROVENANCE_ENTRIES)
    assert provenance().differences(None, allowed=PROVENANCE_ENTRIES[1:]) == ["tasks"]
    images = provenance(tokenizer=None)
    assert images.differences(images.to_dict()) == []
    assert images.differences({**images.to_dict(), "tokenizer": {"name": "gpt2", "sha256": SHA_A}}) == ["tokenizer"]


def test_the_refusal_is_one_line_naming_the_option_the_entries_and_the_override() -> None:
    ours = provenance()
    recorded = {"tasks": ["web", "code"], "tokenizer": {"name": "bpe", "sha256": SHA_B}, "training_data": SHA_A}
    with pytest.raises(UsageError) as caught:
        check_provenance("--domain_weights", "w.json", recorded, ours, allowed=["held_out_data"])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--domain_weights w.json: ")
    assert "tokenizer (bpe sha256 bbbbbbbbbbbb there, gpt2 sha256 aaaaaaaaaaaa here)" in message
    assert "model_size (not recorded)" in message and "held_out_data" not in message.split("; pass")[0]
    assert message.endswith("pass --reference_mismatch_ok tokenizer model_size to use it anyway")
    check_provenance("--domain_weights", "w.json", recorded, ours, allowed=["held_out_data", "tokenizer", "model_size"])


def test_the_override_needs_an_input_to_override() -> None:
    check_override([], {"reference_run": None})
    check_override(["tokenizer"], {"reference_run": None, "domain_weights": "w.json"})
    with pytest.raises(UsageError, match="^reference_mismatch_ok: only used with reference_run or domain_weights$"):
        check_override(["tokenizer"], {"reference_run": None, "domain_weights": None})


def test_a_dataset_fingerprint_is_its_content_not_its_chunks_or_selection() -> None:
    rows = {"text": [f"text {i}" for i in range(10)], "domain": [i % 3 for i in range(10)]}
    whole = Dataset.from_dict(rows)
    chunked = concatenate_datasets([whole.select(range(4)), whole.select(range(4, 10))])
    longer = Dataset.from_dict({key: [*values[7:], *values, *values] for key, values in rows.items()})
    selected = [longer.select(range(3, 13)), longer.select(range(3, 13)).flatten_indices()]
    fingerprints = {dataset_fingerprint(data) for data in [whole, chunked, *selected]}
    assert fingerprints == {dataset_fingerprint(whole)}
    assert dataset_fingerprint(whole) != dataset_fingerprint(whole.select(range(9)))
    assert dataset_fingerprint(whole) != dataset_fingerprint(whole, "seed 1")


def test_a_runs_provenance_holds_its_tokenizer_fingerprint_and_model_size() -> None:
    model = tiny_llama()

    class Tokenizer:  # a slow tokenizer: its vocabulary and special tokens are its definition
        name_or_path = "local/tok"
        special_tokens_map = {"eos_token": "</s>"}

        def __init__(self, vocab: dict[str, int]) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict[str, int]:
            return self.vocab

    first = Provenance.of_run(["a"], Tokenizer({"x": 0}), SHA_A, SHA_B, model)
    assert first.tokenizer["name"] == "local/tok" and first.model_size == model_size(model)
    assert first.training_data == SHA_A and first.held_out_data == SHA_B
    renamed = Provenance.of_run(["a"], Tokenizer({"x": 0}), SHA_A, SHA_B, model, tokenizer_name="moved")
    other = Provenance.of_run(["a"], Tokenizer({"y": 0}), SHA_A, SHA_B, model)
    assert first.differences(renamed.to_dict()) == [] and first.differences(other.to_dict()) == ["tokenizer"]


# ------------------------------------------------------------------------------------------- the recipes
def refused(
    main: Callable[[list[str]], int], prog: str, argv: list[str], output: Path, capsys: pytest.CaptureFixture
) -> str:
    """Run a console ``main`` on an existing output dir holding a user's file: exit 2, no traceback, at most 3 lines
    of error, nothing written to ``output``; the error text."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "notes.txt").write_text("mine")
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{prog}: error: "))
    assert 1 <= len(lines) - first <= 3, err
    assert [path.name for path in output.iterdir()] == ["notes.txt"]
    return " ".join(lines[first:])


def override_named(message: str) -> list[str]:
    """The entries a refusal tells to pass to ``--reference_mismatch_ok``."""
    return message.split("pass --reference_mismatch_ok ")[1].split(" to use it anyway")[0].split()


@pytest.fixture(scope="module")
def decoder_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-step decoder run (the domains' files written beside it), the reference of the cases below."""
    folder = tmp_path_factory.mktemp("decoder")
    causal_lm.run(recipe_argv(folder, "reference", "--max_steps", "1"))
    return folder / "reference"


EXCESS = ["--weighting", "minimax", "--loss_normalization", "excess", "--max_steps", "1"]


def test_the_decoder_writes_the_schema_and_accepts_a_matching_reference_run(decoder_reference: Path, tmp_path) -> None:
    """The bug: the decoder wrote other keys than the check reads. Its report holds the one schema, and the same
    command with --reference_run takes the reference's losses (the check passes: the same tokenizer is trained)."""
    recorded = json.loads((decoder_reference / "task_report.json").read_text())
    assert list(recorded["provenance"]) == list(PROVENANCE_ENTRIES) and recorded["provenance"]["tasks"] == DOMAINS
    argv = recipe_argv(tmp_path, "excess", *EXCESS, "--reference_run", str(decoder_reference), "--seed", "6")
    report = causal_lm.run(argv)["report"]
    assert report["reference_losses"] == recorded["eval_task_loss"]
    assert report["provenance"] == recorded["provenance"]


def test_the_decoder_refuses_a_reference_run_with_another_tokenizer(decoder_reference: Path, tmp_path, capsys):
    """Another tokenizer (the run trains a 300-token one) also changes the held-out sequences and the embedding size;
    the override of exactly those entries trains."""
    argv = recipe_argv(tmp_path, "out", *EXCESS, "--reference_run", str(decoder_reference), "--vocab_size", "300")
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert f"--reference_run {decoder_reference}: its provenance differs" in message
    assert override_named(message) == ["tokenizer", "held_out_data", "model_size"]
    report = causal_lm.run([*argv, "--reference_mismatch_ok", *override_named(message)])["report"]
    assert (
        report["reference_losses"] == json.loads((decoder_reference / "task_report.json").read_text())["eval_task_loss"]
    )


def other_data(tmp_path: Path, reference: Path, *extra: str) -> list[str]:
    """The reference's command (its tokenizer) with the same domain names over other texts (the first 30 of each)."""
    (tmp_path / "other").mkdir()
    files = write_domain_files(tmp_path / "other", texts_per_domain=30)
    argv = recipe_argv(tmp_path, "out", "--tokenizer_name", str(reference), *extra)
    start = argv.index("--domain_files") + 1
    argv[start : start + len(files)] = files
    return argv


def test_the_decoder_refuses_a_reference_run_of_the_same_domains_over_other_data(decoder_reference, tmp_path, capsys):
    argv = other_data(tmp_path, decoder_reference, *EXCESS, "--reference_run", str(decoder_reference))
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert message.startswith(f"robust-pretrain-causal-lm: error: --reference_run {decoder_reference}: ")
    assert override_named(message) == ["training_data", "held_out_data"]


def test_the_decoder_refuses_domain_weights_learned_on_other_data(decoder_reference: Path, tmp_path, capsys):
    """A weights file as the mixture writes it (a run's provenance and its own keys) goes through the same check."""
    recorded = json.loads((decoder_reference / "task_report.json").read_text())["provenance"]
    weights = tmp_path / "weights.json"
    content = {"weights": dict.fromkeys(DOMAINS, 1.0), "provenance": {**recorded, "steps": 1, "rounds": []}}
    weights.write_text(json.dumps(content))
    argv = other_data(tmp_path, decoder_reference, "--domain_weights", str(weights))
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert f"--domain_weights {weights}: its provenance differs" in message
    assert override_named(message) == ["training_data", "held_out_data"]


def test_the_decoder_refuses_a_reference_report_of_the_old_decoder_keys(tmp_path, capsys) -> None:
    """What the decoder used to write (tokenizer_sha256, data_sha256, model_size as a count) records no entry of the
    schema: every entry is a difference."""
    (tmp_path / "old").mkdir()
    old = {"tokenizer_sha256": SHA_A, "data_sha256": dict.fromkeys(DOMAINS, SHA_A), "model_size": 1000}
    report = {"tasks": DOMAINS, "eval_task_loss": dict.fromkeys(DOMAINS, 3.0), "provenance": old}
    (tmp_path / "old" / "task_report.json").write_text(json.dumps(report))
    argv = recipe_argv(tmp_path, "out", *EXCESS, "--reference_run", str(tmp_path / "old"))
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert override_named(message) == ["tasks", "tokenizer", "training_data", "held_out_data", "model_size"]
    assert "tasks (not recorded)" in message


def test_the_decoder_refuses_the_override_without_an_input(tmp_path, capsys) -> None:
    argv = recipe_argv(tmp_path, "out", "--reference_mismatch_ok", "tokenizer")
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert "reference_mismatch_ok: only used with reference_run or domain_weights" in message


def test_the_pos_recipe_refuses_a_reference_run_recorded_before_the_schema(tmp_path, capsys) -> None:
    """A PoS report of the former schema (tasks, tokenizer, held-out data): the entries it lacks are differences."""
    (tmp_path / "old").mkdir()
    old = {"tasks": TASKS, "tokenizer": {"name": "bert", "sha256": SHA_A}, "held_out_data": SHA_A}
    report = {"tasks": TASKS, "eval_task_loss": dict.fromkeys(TASKS, 3.0), "provenance": old}
    (tmp_path / "old" / "task_report.json").write_text(json.dumps(report))
    every_task = "Oh , the big cat and I sat quietly on a mat .\nWow , my old dog and you ran happily in the park .\n"
    (tmp_path / "train.txt").write_text(every_task * 12)  # a word of each of the 9 tasks
    argv = ["--config", str(DEMO_CONFIG), "--output_dir", str(tmp_path / "out"), "--train_file"]
    argv += [str(tmp_path / "train.txt"), *EXCESS, "--reference_run", str(tmp_path / "old")]
    message = refused(pos_mlm.main, "robust-pretrain-pos-mlm", argv, tmp_path / "out", capsys)
    assert f"--reference_run {tmp_path / 'old'}: its provenance differs" in message
    assert override_named(message) == ["tokenizer", "training_data", "held_out_data", "model_size"]


def test_the_vision_recipe_refuses_a_reference_run_recorded_before_the_schema(tmp_path, capsys) -> None:
    """An MM-MAE report of the former schema: no tokenizer on either side matches; the entries it lacks differ."""
    import test_recipe_multimae

    modalities = ["rgb", "depth", "semseg"]
    (tmp_path / "old").mkdir()
    old = {"tasks": modalities, "tokenizer": None, "held_out_data": SHA_A}
    report = {"tasks": modalities, "eval_task_loss": dict.fromkeys(modalities, 1.0), "provenance": old}
    (tmp_path / "old" / "task_report.json").write_text(json.dumps(report))
    argv = test_recipe_multimae.argv(tmp_path / "out", *EXCESS, "--reference_run", str(tmp_path / "old"))
    with test_recipe_multimae.single_thread():
        message = refused(multimae.main, "robust-pretrain-multimae", argv, tmp_path / "out", capsys)
    assert override_named(message) == ["training_data", "held_out_data", "model_size"]


def test_the_decoder_tells_its_training_data_from_its_held_out_data(tmp_path, capsys) -> None:
    """Streamed, each domain's first texts are its held-out data: the same first texts followed by the rest in another
    order differ from the reference in training_data only."""
    tokenizer = tmp_path / "tokenizer"
    train_bpe_tokenizer(ewt_genre_texts("train")["text"][:300], 400).save_pretrained(tokenizer)
    streamed = ["--streaming", "true", "--stream_held_out_texts", "4", "--tokenizer_name", str(tokenizer)]

    def streamed_argv(output: str, *extra: str) -> list[str]:  # a stream holds out its first texts: no percentage
        full = recipe_argv(tmp_path, output, *streamed, *extra)
        at = full.index("--validation_split_percentage")
        return full[:at] + full[at + 2 :]

    causal_lm.run(streamed_argv("reference", "--max_steps", "1"))
    argv = streamed_argv("out", *EXCESS, "--reference_run", str(tmp_path / "reference"))
    for name in DOMAINS:  # the files the reference read, rewritten in place after it finished
        lines = (tmp_path / f"{name}.txt").read_text().splitlines()
        (tmp_path / f"{name}.txt").write_text("\n".join(lines[:4] + lines[:3:-1]) + "\n")
    message = refused(causal_lm.main, "robust-pretrain-causal-lm", argv, tmp_path / "out", capsys)
    assert override_named(message) == ["training_data"]


@pytest.mark.slow
def test_a_streamed_pos_run_of_another_seed_accepts_its_reference_run(tmp_path) -> None:
    """The provenance is the data's, not the seed's: a reference run of seed 1 serves a run of seed 2 (streamed: the
    training data's fingerprint is of the stream's first rows)."""
    texts = [text.replace("\n", " ") for text in load_ewt_corpus("train")["text"][:120]]
    for shard in range(2):
        (tmp_path / f"part-{shard}.txt").write_text("\n".join(texts[shard::2]) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(texts) + "\n")  # every task has held-out words
    train_wordpiece_tokenizer(texts, 600).save_pretrained(tmp_path / "tokenizer")

    def run(output: str, seed: str, *extra: str) -> dict:
        return pos_mlm.run(
            [
                "--streaming",
                "true",
                "--train_file",
                str(tmp_path / "part-*.txt"),
                "--validation_file",
                str(tmp_path / "valid.txt"),
                "--tokenizer_name",
                str(tmp_path / "tokenizer"),
                "--model_size",
                "tiny",
                "--max_seq_length",
                "32",
                "--per_device_train_batch_size",
                "4",
                "--max_steps",
                "1",
                "--save_strategy",
                "no",
                "--use_cpu",
                "true",
                "--disable_tqdm",
                "true",
                "--seed",
                seed,
                "--output_dir",
                str(tmp_path / output),
                *extra,
            ]  # fmt: skip
        )["report"]

    reference = run("reference", "1", "--weighting", "proportional")
    report = run("excess", "2", *EXCESS, "--reference_run", str(tmp_path / "reference"))
    assert report["provenance"] == reference["provenance"]
    assert report["reference_losses"] == reference["eval_task_loss"]


def test_a_vision_run_of_another_seed_accepts_its_reference_run(tmp_path) -> None:
    import test_recipe_multimae

    with test_recipe_multimae.single_thread():
        reference = multimae.run(test_recipe_multimae.argv(tmp_path / "reference", "--max_steps", "1"))["report"]
        argv = test_recipe_multimae.argv(tmp_path / "excess", *EXCESS, "--reference_run", str(tmp_path / "reference"))
        report = multimae.run([*argv, "--seed", "2"])["report"]
    assert report["provenance"] == reference["provenance"] and report["provenance"]["tokenizer"] is None
    assert report["reference_losses"] == reference["eval_task_loss"]
