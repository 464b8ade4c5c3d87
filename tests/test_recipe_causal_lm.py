"""The causal-LM recipe with data domains as tasks: packing within a domain, domain-weighted draws (by step, the same on
every process), the per-domain report and card, a model that loads with AutoModelForCausalLM and generates in a
pipeline, weights from a file with their provenance checked, and publishing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from robust_pretrain.data.bpe import train_bpe_tokenizer
from robust_pretrain.data.domains import (
    EWT_GENRES,
    DomainCollator,
    batch_seed,
    domain_counts,
    ewt_genre_texts,
    pack_domains,
)
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.reference import PROVENANCE_ENTRIES
from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule

DOMAINS = ["answers", "email", "reviews"]


def write_domain_files(folder: Path, texts_per_domain: int = 40) -> list[str]:
    """One .txt file per domain (EWT genre paragraphs); the recipe's ``--domain_files`` entries."""
    corpus = ewt_genre_texts("train")
    entries = []
    for name in DOMAINS:
        genre = EWT_GENRES.index(name)
        texts = [text for text, d in zip(corpus["text"], corpus["domain"], strict=True) if d == genre]
        path = folder / f"{name}.txt"
        path.write_text("\n".join(texts[:texts_per_domain]) + "\n", encoding="utf-8")
        entries.append(f"{name}={path}")
    return entries


def recipe_argv(tmp_path: Path, output: str, *extra: str) -> list[str]:
    return [
        "--domain_files", *write_domain_files(tmp_path),
        "--validation_split_percentage", "10",
        "--vocab_size", "400",
        "--model_size", "tiny",
        "--max_seq_length", "32",
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "16",
        "--max_steps", "6",
        "--logging_steps", "1",
        "--save_strategy", "no",
        "--learning_rate", "3e-3",
        "--seed", "5",
        "--use_cpu", "true",
        "--disable_tqdm", "true",
        "--output_dir", str(tmp_path / output),
        *extra,
    ]  # fmt: skip


class FakeTokenizer:
    """Whitespace-split integer tokens (``"3 4"`` -> ``[3, 4]``), eos 1."""

    eos_token_id = 1

    def __call__(self, texts, **kwargs):
        return {"input_ids": [[int(token) for token in text.split()] for text in texts]}


def test_packing_never_crosses_a_domain_boundary():
    """Texts of domains 0 and 1 interleaved: each sequence holds one domain's tokens, and a domain's sequences
    concatenated are its texts, each followed by eos, in order."""
    from datasets import Dataset

    texts = ["10 11 12", "20 21", "13 14", "22 23 24 25", "15"]
    domains = [0, 1, 0, 1, 0]
    packed = pack_domains(Dataset.from_dict({"text": texts, "domain": domains}), FakeTokenizer(), 2, 4)
    assert domain_counts(packed, 2) == [3, 2]
    by_domain = {0: [], 1: []}
    for ids, task in zip(packed["input_ids"], packed["task_ids"], strict=True):
        assert len(ids) <= 4 and all(token == 1 or token // 10 == task + 1 for token in ids)
        by_domain[task].extend(ids)
    assert by_domain[0] == [10, 11, 12, 1, 13, 14, 1, 15, 1]
    assert by_domain[1] == [20, 21, 1, 22, 23, 24, 25, 1]


def test_packing_from_a_mapping_numbers_the_domains_in_its_order():
    """``pack_domain_texts({name: texts})``: domain ids follow the mapping's order (the collator's ``task_names``)."""
    from robust_pretrain.data import pack_domain_texts

    packed = pack_domain_texts(
        {"mail": ["20 21", "22 23 24 25"], "web": ["10 11 12", "13 14", "15"]}, FakeTokenizer(), 4
    )
    by_domain = {0: [], 1: []}
    for ids, task in zip(packed["input_ids"], packed["task_ids"], strict=True):
        by_domain[task].extend(ids)
    assert by_domain == {0: [20, 21, 1, 22, 23, 24, 25, 1], 1: [10, 11, 12, 1, 13, 14, 1, 15, 1]}


def _sequences(counts: list[int]):
    from datasets import Dataset

    rows = [(d, i) for d, count in enumerate(counts) for i in range(count)]
    return Dataset.from_dict({"input_ids": [[100 * d + i, 7] for d, i in rows], "task_ids": [d for d, _ in rows]})


def _drawing(weights, sequences, seed: int = 0, rows: int = 1, rank: int = 0, processes: int = 1) -> DomainCollator:
    """A DomainCollator drawing from ``sequences`` by fixed ``weights``, as ``MinimaxTrainer`` hands it the schedule."""
    collator = DomainCollator(0, task_names=[str(d) for d in range(len(weights))])
    placement = SimpleNamespace(seed=seed, per_device_train_batch_size=rows, process_index=rank, world_size=processes)
    collator.sample_tasks(TaskSamplingSchedule(len(weights), fixed_weights=weights), sequences, placement)
    return collator


def test_drawn_domains_follow_the_weights_and_every_process_draws_its_rows_of_one_global_draw():
    weights = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    sequences = _sequences([5, 7, 3])
    collators = [
        _drawing(weights, sequences, seed=9, rows=4, rank=rank, processes=2)
        for rank in (0, 1)
    ]  # fmt: skip
    drawn = torch.zeros(3)
    for step in range(1, 301):
        batches = [collator([{}] * 4) for collator in collators]
        both = torch.cat([batch["input_ids"][:, 0] for batch in batches])
        # the same global draw, whoever computes it: a single process with 8 rows draws exactly these rows
        single = _drawing(weights, sequences, seed=9, rows=8)
        single.schedule.start_epoch(step, 1)
        assert torch.equal(single([{}] * 8)["input_ids"][:, 0], both)
        for batch in batches:
            assert torch.equal(batch["task_ids"], batch["input_ids"][:, 0] // 100)
            assert batch["labels"].tolist() == batch["input_ids"].tolist()
        drawn += torch.bincount(both // 100, minlength=3)
    expected = weights * drawn.sum()
    statistic = float(((drawn - expected) ** 2 / expected).sum())
    assert statistic < chi2.ppf(0.999, df=2), drawn.tolist()


def test_the_draw_within_a_domain_covers_every_sequence_uniformly():
    """A drawn domain's sequence is uniform over that domain's sequences: every one is drawn, the last included, each
    about as often as the others (chi-squared)."""
    counts = [5, 7, 3]
    collator = _drawing([1.0, 1.0, 1.0], _sequences(counts), seed=4, rows=8)
    drawn = torch.cat([collator([{}] * 8)["input_ids"][:, 0] for _ in range(300)])
    for domain, count in enumerate(counts):
        frequency = torch.bincount(drawn[drawn // 100 == domain] % 100, minlength=count).double()
        assert len(frequency) == count and bool((frequency > 0).all()), (domain, frequency.tolist())
        expected = frequency.sum() / count
        statistic = float(((frequency - expected) ** 2 / expected).sum())
        assert statistic < chi2.ppf(0.999, df=count - 1), (domain, frequency.tolist())


def test_the_draw_of_a_step_depends_on_the_seed_step_and_micro_batch_only():
    assert batch_seed(1, 5, 0) == batch_seed(1, 5, 0)
    assert len({batch_seed(1, 5, 0), batch_seed(1, 5, 1), batch_seed(1, 6, 0), batch_seed(2, 5, 0)}) == 4
    sequences = _sequences([4, 4])
    weights = torch.tensor([0.5, 0.5])

    def rows(start_step: int, accumulation: int, batches: int) -> list[list[int]]:
        collator = _drawing(weights, sequences, seed=3, rows=3)
        collator.schedule.start_epoch(start_step, accumulation)
        return [collator([{}] * 3)["input_ids"][:, 0].tolist() for _ in range(batches)]

    # a run resumed at step 3 draws what the uninterrupted run drew from step 3 on
    assert rows(1, 2, 8)[4:] == rows(3, 2, 4)


def test_held_out_batches_are_padded_not_drawn():
    collator = _drawing([1.0, 0.0], _sequences([2, 2]))
    batch = collator([{"input_ids": [5, 6, 7], "task_ids": 1}, {"input_ids": [8], "task_ids": 0}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert batch["task_ids"].tolist() == [1, 0]


def test_ewt_genres_are_the_five_sent_id_prefixes():
    train, test = ewt_genre_texts("train"), ewt_genre_texts("test")
    assert sorted(set(train["domain"])) == sorted(set(test["domain"])) == list(range(5))
    assert EWT_GENRES == ("answers", "email", "newsgroup", "reviews", "weblog")


@pytest.mark.slow
def test_recipe_reports_each_domain_and_its_model_generates(tmp_path):
    result = causal_lm.run(recipe_argv(tmp_path, "natural"))
    output = tmp_path / "natural"
    report = json.loads((output / "task_report.json").read_text())
    assert report["tasks"] == DOMAINS and report["mixture_kind"] == "natural"
    sequences = report["training_sequences"]
    total = sum(sequences.values())
    for name in DOMAINS:
        loss = report["eval_task_loss"][name]
        assert report["eval_task_perplexity"][name] == pytest.approx(math.exp(loss), rel=1e-9)
        assert report["mixture_weights"][name] == pytest.approx(sequences[name] / total)
        assert result[f"eval_task_loss/{name}"] == loss
    worst = max(report["eval_task_loss"].values())
    assert report["eval_worst_task_perplexity"] == pytest.approx(math.exp(worst), rel=1e-9)
    assert report["eval_mean_task_perplexity"] == pytest.approx(sum(report["eval_task_perplexity"].values()) / 3)
    assert list(report["provenance"]) == list(PROVENANCE_ENTRIES) and report["provenance"]["tasks"] == DOMAINS
    card = (output / "README.md").read_text()
    for name in DOMAINS:
        perplexity = report["eval_task_perplexity"][name]
        assert f"| {name} | {sequences[name]} | {sequences[name] / total:.4f} | {perplexity:.2f} |" in card
    assert "pipeline_tag: text-generation" in card

    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert type(model).__name__ == "LlamaForCausalLM" and tokenizer.eos_token == "</s>"
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = generator("The email", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert text.startswith("The email") and len(tokenizer(text)["input_ids"]) > len(tokenizer("The email")["input_ids"])


@pytest.mark.slow
def test_online_sampling_averages_the_strategy_weights_and_logs_its_alpha(tmp_path):
    causal_lm.run(recipe_argv(tmp_path, "online", "--task_sampling", "online", "--alpha_auto_k", "2"))
    output = tmp_path / "online"
    state = json.loads((output / "trainer_state.json").read_text())
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(logs) == 6 and all("minimax_alpha" in entry for entry in logs)
    sampling = torch.tensor([[entry[f"task_sampling_weight/{name}"] for name in DOMAINS] for entry in logs])
    report = json.loads((output / "task_report.json").read_text())
    assert report["mixture_kind"] == "online time-average"
    averaged = [report["mixture_weights"][name] for name in DOMAINS]
    assert averaged == pytest.approx(sampling.double().mean(0).tolist(), abs=1e-5)
    effective = math.exp(-sum(w * math.log(w) for w in sampling[-1].tolist()))
    assert effective == pytest.approx(2.0, abs=1e-3)  # alpha_auto_k: the weights' effective number is 2


@pytest.mark.slow
def test_sampling_weights_are_summarised_beyond_max_logged_tasks(tmp_path):
    causal_lm.run(recipe_argv(tmp_path, "many", "--task_sampling", "online", "--max_logged_tasks", "2"))
    state = json.loads((tmp_path / "many" / "trainer_state.json").read_text())
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert not any(key.startswith("task_sampling_weight/") for entry in logs for key in entry)
    assert all(1.0 <= entry["task_sampling_weight_effective_number"] <= 3.0 for entry in logs)


@pytest.mark.slow
def test_importance_weighting_draws_from_one_file_toward_the_other(tmp_path):
    """--domain_weights q (drawn), --objective_weights w (minimised in expectation): the logged objective weights are
    (w_d / q_d) N_d / N, N_d the step's targets of domain d, and the sampling weights are q."""
    q, w = {"answers": 0.2, "email": 0.3, "reviews": 0.5}, {"answers": 0.6, "email": 0.3, "reviews": 0.1}
    for name, weights in (("q.json", q), ("w.json", w)):
        (tmp_path / name).write_text(json.dumps({"weights": weights}))
    files = ["--domain_weights", str(tmp_path / "q.json"), "--objective_weights", str(tmp_path / "w.json")]
    files += ["--reference_mismatch_ok", *PROVENANCE_ENTRIES]  # hand-written weights record no provenance
    causal_lm.run(recipe_argv(tmp_path, "corrected", *files, "--task_sampling", "fixed", "--importance_weighting", "1"))
    output = tmp_path / "corrected"
    logs = [e for e in json.loads((output / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(logs) == 6
    for entry in logs:
        assert [entry[f"task_sampling_weight/{name}"] for name in DOMAINS] == pytest.approx(list(q.values()))
        ratio = sum(entry[f"task_weight/{name}"] * q[name] / w[name] for name in DOMAINS)  # sum_d N_d / N
        assert ratio == pytest.approx(1.0, abs=1e-5)
    options = json.loads((output / "weighting_state.json").read_text())["options"]
    assert options["objective"] == "FixedWeighting" and options["sampling_weights"] == pytest.approx(list(q.values()))


@pytest.mark.slow
def test_weights_from_a_file_are_drawn_and_their_provenance_is_checked(tmp_path, capsys):
    causal_lm.run(recipe_argv(tmp_path, "first"))
    provenance = json.loads((tmp_path / "first" / "task_report.json").read_text())["provenance"]
    weights = {"answers": 0.0, "email": 0.25, "reviews": 0.75}
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"weights": weights, "provenance": provenance}))
    tokenizer = ["--tokenizer_name", str(tmp_path / "first")]
    argv = recipe_argv(tmp_path, "fixed", "--domain_weights", str(path), *tokenizer)
    report = causal_lm.run(argv)["report"]
    assert report["mixture_kind"] == "file" and report["mixture_weights"] == weights
    # the drawn sequences: a trained-on domain loss is logged only for domains with weight > 0
    state = json.loads((tmp_path / "fixed" / "trainer_state.json").read_text())
    assert not any("task_loss/answers" in entry for entry in state["log_history"] if "loss" in entry)

    # another tokenizer (the run trains its own 300-token one): exit 2, nothing trained
    other = recipe_argv(tmp_path, "other", "--domain_weights", str(path), "--vocab_size", "300")
    assert causal_lm.main(other) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    # each difference named: the tokenizer, the held-out token ids and the model size its vocabulary changes
    differing = ["tokenizer", "held_out_data", "model_size"]
    assert len(errors) == 1 and f"pass --reference_mismatch_ok {' '.join(differing)} to use it" in errors[0]
    assert not (tmp_path / "other" / "model.safetensors").exists()
    report = causal_lm.run([*other, "--reference_mismatch_ok", *differing])["report"]
    assert report["mixture_weights"] == weights


@pytest.mark.slow
def test_the_recipe_publishes_its_model_and_card(local_hub, tmp_path):
    from local_hub import DEFAULT_TOKEN, DEFAULT_USER

    argv = recipe_argv(tmp_path, "pushed", "--push_to_hub", "true", "--hub_model_id", "tiny-decoder")
    causal_lm.run([*argv, "--hub_token", DEFAULT_TOKEN])
    repo_id = f"{DEFAULT_USER}/tiny-decoder"
    files = local_hub.files(repo_id)
    assert "model.safetensors" in files and "tokenizer.json" in files
    card = files["README.md"].decode()
    assert f'pipeline("text-generation", model="{repo_id}")' in card and "| reviews |" in card


@pytest.mark.slow
def test_a_streamed_run_extended_from_its_checkpoint_matches_an_uninterrupted_one(tmp_path):
    """--streaming: every domain file a stream (its first texts held out), the domains drawn by the file's weights;
    3 steps, then extended to 6 from checkpoint-3 (the Trainer replays the stream), equals 6 steps in one go."""
    tokenizer_dir = tmp_path / "tokenizer"
    train_bpe_tokenizer(ewt_genre_texts("train")["text"][:300], 400).save_pretrained(tokenizer_dir)
    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps({"weights": {"answers": 0.5, "email": 0.3, "reviews": 0.2}}))  # no provenance
    streaming = ["--streaming", "true", "--stream_held_out_texts", "4", "--tokenizer_name", str(tokenizer_dir),
                 "--domain_weights", str(weights), "--reference_mismatch_ok", *PROVENANCE_ENTRIES,
                 "--lr_scheduler_type", "constant", "--warmup_steps", "0",
                 "--save_strategy", "steps", "--save_steps", "3"]  # fmt: skip

    def streamed_argv(output: str, *extra: str) -> list[str]:  # a stream holds out its first texts: no percentage
        full = recipe_argv(tmp_path, output, *streaming, *extra)
        at = full.index("--validation_split_percentage")
        return full[:at] + full[at + 2 :]

    whole = causal_lm.run(streamed_argv("whole"))["report"]
    causal_lm.run(streamed_argv("extended", "--max_steps", "3"))
    extended = causal_lm.run(streamed_argv("extended"))["report"]
    logs = [  # an iterable dataset's "epoch" is the step over max_steps: it differs
        [
            {key: value for key, value in entry.items() if key != "epoch"}
            for entry in json.loads((tmp_path / d / "trainer_state.json").read_text())["log_history"]
            if "loss" in entry
        ]
        for d in ("whole", "extended")
    ]
    assert len(logs[0]) == 6 and logs[1] == logs[0]
    first, second = (AutoModelForCausalLM.from_pretrained(tmp_path / d) for d in ("whole", "extended"))
    for (name, a), b in zip(first.named_parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert whole["mixture_kind"] == extended["mixture_kind"] == "file"
    assert whole["eval_task_loss"] == extended["eval_task_loss"] and set(whole["eval_task_loss"]) == set(DOMAINS)


@pytest.mark.slow
def test_domains_from_a_column_or_from_dataset_folders(tmp_path):
    """``--train_file`` + ``--domain_column``: the column's distinct values, sorted, are the domains; a
    ``--domain_files`` source may be a dataset folder (several datasets as domains)."""
    corpus = ewt_genre_texts("train")
    rows = [
        {"text": text, "source": EWT_GENRES[domain]}
        for text, domain in zip(corpus["text"][:4000:20], corpus["domain"][:4000:20], strict=True)
    ]
    data = tmp_path / "all.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    argv = [arg for arg in recipe_argv(tmp_path, "column") if "=" not in arg and arg != "--domain_files"]
    report = causal_lm.run([*argv, "--train_file", str(data), "--domain_column", "source"])["report"]
    present = sorted({row["source"] for row in rows})
    assert report["tasks"] == present and len(present) >= 2
    assert sum(report["training_sequences"].values()) > 0
    for name in ("left", "right"):
        folder = tmp_path / name
        folder.mkdir()
        half = rows[: len(rows) // 2] if name == "left" else rows[len(rows) // 2 :]
        (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in half) + "\n")
    folders = ["--domain_files", f"left={tmp_path / 'left'}", f"right={tmp_path / 'right'}"]
    report = causal_lm.run([*argv[:-1], str(tmp_path / "folders"), *folders])["report"]
    assert report["tasks"] == ["left", "right"] and set(report["eval_task_perplexity"]) == {"left", "right"}
