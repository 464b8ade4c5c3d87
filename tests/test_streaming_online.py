"""Online domain sampling on streams (``--streaming --task_sampling online``): a stream per domain, each step's rows
drawn with the strategy's weights, every process reading its rows of one global draw, and an exact resume (each
domain's position and pass in the checkpoint) also after a tiny domain wrapped several times."""

from __future__ import annotations

import json
import math
import random
import string
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import load_dataset
from ports import free_port
from processes import checkout_env, wait_for_checkpoint
from safetensors.torch import load_file
from test_recipe_causal_lm import FakeTokenizer
from transformers import AutoTokenizer

from robust_pretrain.data.bpe import train_bpe_tokenizer
from robust_pretrain.data.domains import EWT_GENRES, ewt_genre_texts
from robust_pretrain.data.streaming import DomainStreams, StreamDomainCollator, StreamPositionsCallback
from robust_pretrain.pretraining.common import last_complete_checkpoint
from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "pretrain_causal_lm.py"


# ------------------------------------------------------------------------------------------- streams and collator
@pytest.fixture
def number_streams(tmp_path):
    """Two domains of whitespace-separated integer tokens (:class:`FakeTokenizer`): a long one (40 texts) and a tiny
    one (2 texts, 2 packed sequences of 4 tokens per pass)."""
    long_texts = [" ".join(str(100 + 7 * i + j) for j in range(1 + i % 5)) for i in range(40)]
    tiny_texts = ["11 12", "13 14 15"]  # with eos: 11 12 1 13 | 14 15 1
    streams = []
    for name, texts in (("long", long_texts), ("tiny", tiny_texts)):
        (tmp_path / f"{name}.txt").write_text("\n".join(texts) + "\n")
        streams.append(load_dataset("text", data_files={"train": [str(tmp_path / f"{name}.txt")]}, streaming=True))
    return [stream["train"] for stream in streams]


def reader(streams, shuffle_buffer: int = 4) -> DomainStreams:
    return DomainStreams(streams, FakeTokenizer(), 4, seed=3, shuffle_buffer=shuffle_buffer)


def test_a_tiny_domain_wraps_and_resumes_mid_pass_from_any_step(number_streams):
    """Rows read 4 per step (a fixed domain pattern, mostly the tiny domain); the position after each step, taken
    while the next step's rows were already read (the data loader reads ahead), continues exactly as the reader."""
    pattern = [1, 1, 0, 1] * 12
    first = reader(number_streams)
    rows, states = [], {}
    for step in range(1, len(pattern) // 4 + 1):
        first.start_batch(step, 0)
        rows.append([first.next_row(d)["input_ids"] for d in pattern[(step - 1) * 4 : step * 4]])
        if step >= 2:
            states[step - 2] = first.state_at(step - 2)  # step - 1's rows and this step's were read since
    assert states[9] == {"wraps": [0, 13], "rows": [9, 1]}  # 27 tiny rows read, 2 a pass: the 14th pass begun
    for step, state in states.items():
        resumed = reader(number_streams)
        resumed.load_state_dict(json.loads(json.dumps(state)))  # as saved in a checkpoint
        again = [[resumed.next_row(d)["input_ids"] for d in pattern[s * 4 : (s + 1) * 4]] for s in range(step, 12)]
        assert again == rows[step:], step


def test_each_pass_is_shuffled_anew_by_the_seed(number_streams):
    """With a shuffle buffer the long domain's passes (40 sequences each) come in different orders of the same
    tokens, the same in every run (seeded by the seed, the domain and the pass); without one each pass is the
    stream's order."""
    shuffled, again, plain = reader(number_streams), reader(number_streams), reader(number_streams, shuffle_buffer=0)
    rows = [shuffled.next_row(0)["input_ids"] for _ in range(120)]
    assert shuffled.position() == {"wraps": [2, 0], "rows": [40, 0]}
    assert [again.next_row(0)["input_ids"] for _ in range(120)] == rows
    passes = [rows[i : i + 40] for i in (0, 40, 80)]
    assert passes[0] != passes[1] != passes[2] != passes[0]
    assert len({tuple(sorted(t for row in p for t in row)) for p in passes}) == 1
    in_order = [plain.next_row(0)["input_ids"] for _ in range(80)]
    assert in_order[:40] == in_order[40:] != passes[0]


def collate(streams: list, process_index: int, world_size: int, rows: int, steps: int) -> list[dict]:
    """``steps`` training batches of one process, the sampling weights changing every step (published by step)."""
    schedule = TaskSamplingSchedule(2)
    collator = StreamDomainCollator(pad_token_id=0, task_names=["long", "tiny"])
    args = SimpleNamespace(
        seed=5, per_device_train_batch_size=rows, process_index=process_index, world_size=world_size,
        max_steps=steps, gradient_accumulation_steps=1, dataloader_num_workers=0,
    )  # fmt: skip
    assert len(collator.sample_tasks(schedule, reader(streams), args)) == steps * rows * world_size
    batches = []
    for step in range(1, steps + 1):
        batches.append(collator([{}] * rows))
        schedule.publish(step, [1.0 + step % 3, 2.0])
    return batches


def unpadded(batch: dict) -> list[tuple[int, list[int]]]:
    return [
        (int(task), ids[mask == 1].tolist())
        for task, ids, mask in zip(batch["task_ids"], batch["input_ids"], batch["attention_mask"], strict=True)
    ]


def test_two_processes_take_their_rows_of_one_global_draw(number_streams):
    """Process 0 and 1 (2 rows each) together collate exactly the rows, in order, that 1 process with their global
    batch (4 rows) collates, step after step, while the tiny domain wraps."""
    one = collate(number_streams, 0, 1, 4, 10)
    first, second = collate(number_streams, 0, 2, 2, 10), collate(number_streams, 1, 2, 2, 10)
    for step, (whole, a, b) in enumerate(zip(one, first, second, strict=True), start=1):
        assert unpadded(a) + unpadded(b) == unpadded(whole), step
    drawn = [task for batch in one for task, _ in unpadded(batch)]
    assert drawn.count(1) > 8 and drawn.count(0) > 8  # both domains drawn, the tiny one (2 rows a pass) wrapped


def test_a_checkpoint_without_stream_positions_is_refused(number_streams, tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"stateful_callbacks": {}}))
    with pytest.raises(ValueError, match="holds no stream positions"):
        StreamPositionsCallback(reader(number_streams)).load(str(tmp_path))
    with pytest.raises(ValueError, match="stream positions of 1 domains, this run has 2"):
        reader(number_streams).load_state_dict({"wraps": [0], "rows": [0]})


# ----------------------------------------------------------------------------------------------- the recipe
MAX_STEPS, KILL_AFTER = 10, 5
TINY = "tiny"


def write_domains(folder: Path) -> list[str]:
    """Two EWT genres (30 texts each) and a tiny domain: 4 held-out texts, then 3 strings of random letters (2 packed
    sequences a pass, hard to predict, so minimax keeps drawing it and it wraps several times before the kill)."""
    corpus = ewt_genre_texts("train")
    rng = random.Random(0)
    entries = []
    for name in ("answers", "email", TINY):
        genre = EWT_GENRES.index("reviews" if name == TINY else name)
        texts = [text for text, d in zip(corpus["text"], corpus["domain"], strict=True) if d == genre]
        if name == TINY:
            letters = [" ".join("".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(5)) for _ in range(3)]
            texts = texts[:4] + letters
        (folder / f"{name}.txt").write_text("\n".join(texts[:30]) + "\n", encoding="utf-8")
        entries.append(f"{name}={folder / f'{name}.txt'}")
    return entries


@pytest.fixture(scope="module")
def domain_data(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("domains")
    train_bpe_tokenizer(ewt_genre_texts("train")["text"][:300], 400).save_pretrained(folder / "tokenizer")
    return ["--domain_files", *write_domains(folder), "--tokenizer_name", str(folder / "tokenizer")]


def command(domain_data: list[str], output_dir: Path, batch_size: int, *extra: str) -> list[str]:
    return [
        str(RECIPE), *domain_data,
        "--streaming", "true", "--stream_held_out_texts", "4", "--stream_shuffle_buffer", "8",
        "--task_sampling", "online", "--weighting", "minimax", "--alpha", "1",
        "--max_seq_length", "32", "--per_device_train_batch_size", str(batch_size),
        "--per_device_eval_batch_size", "16",
        "--max_steps", str(MAX_STEPS), "--logging_steps", "1", "--learning_rate", "3e-3", "--warmup_steps", "0",
        "--seed", "11", "--use_cpu", "true", "--disable_tqdm", "true", "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip


def logs(output_dir: Path) -> list[dict]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


def positions(checkpoint: Path) -> dict[str, list[int]]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["stateful_callbacks"]["StreamPositionsCallback"]["attributes"]["positions"]


@pytest.mark.slow
def test_a_streamed_online_run_killed_after_a_checkpoint_resumes_bit_exact(domain_data, tmp_path):
    """One process (4 rows, 2 micro-batches a step), SIGKILLed once checkpoint-5 is written (the tiny domain has
    wrapped several times by then) and rerun: the same per-step losses, sampling and objective weights, model and
    averaged weights as an uninterrupted run."""
    tokenizer = AutoTokenizer.from_pretrained(domain_data[domain_data.index("--tokenizer_name") + 1])
    tiny_texts = Path(domain_data[3].split("=", 1)[1]).read_text().splitlines()[4:]  # past the held-out ones
    tokens = tokenizer(tiny_texts, add_special_tokens=False)["input_ids"]
    tiny_pass = math.ceil(sum(len(ids) + 1 for ids in tokens) / 32)  # each text and its eos, in 32-token sequences
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    saving = ["--save_steps", "1", "--save_total_limit", "20", "--gradient_accumulation_steps", "2"]
    whole_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    whole = subprocess.run(
        [sys.executable, *command(domain_data, whole_dir, 4, *saving)], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    rerun_command = [sys.executable, *command(domain_data, resumed_dir, 4, *saving)]
    with open(tmp_path / "killed.log", "w") as log:
        killed = subprocess.Popen(rerun_command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_checkpoint(killed, resumed_dir / f"checkpoint-{KILL_AFTER}", tmp_path / "killed.log", 300)
        finally:
            killed.kill()
            killed.wait()
    assert killed.returncode == -9 and not (resumed_dir / "model.safetensors").exists()
    last = Path(last_complete_checkpoint(resumed_dir))
    steps_done = int(last.name.split("-")[1])
    assert KILL_AFTER <= steps_done < MAX_STEPS
    assert positions(last) == positions(whole_dir / last.name)
    assert positions(last)["wraps"][2] >= 3  # the tiny domain's passes
    for step in range(1, MAX_STEPS + 1):  # the rows of the checkpoint's steps, not of the batch read ahead
        read = positions(whole_dir / f"checkpoint-{step}")
        assert read["wraps"][:2] == [0, 0] and sum(read["rows"]) + read["wraps"][2] * tiny_pass == 8 * step, step
    rerun = subprocess.run(rerun_command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    expected, got = logs(whole_dir), logs(resumed_dir)
    assert len(expected) == MAX_STEPS and got == expected
    assert expected[-1]["task_sampling_weight/tiny"] != pytest.approx(1 / 3, abs=0.01)  # minimax moved the weights
    assert positions(resumed_dir / f"checkpoint-{MAX_STEPS}") == positions(whole_dir / f"checkpoint-{MAX_STEPS}")
    first, second = load_file(whole_dir / "model.safetensors"), load_file(resumed_dir / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    reports = [json.loads((d / "task_report.json").read_text()) for d in (whole_dir, resumed_dir)]
    assert reports[0]["mixture_kind"] == "online time-average"
    assert reports[1]["mixture_weights"] == reports[0]["mixture_weights"]


@pytest.mark.slow
def test_two_gloo_processes_read_the_rows_of_one_process_with_their_global_batch(domain_data, tmp_path):
    """torchrun with 2 processes of 4 rows against 1 process of 8 rows: the same rows in the same steps (each
    domain's position and pass after every step equal), hence the same losses, weights and model."""
    env = checkout_env(OMP_NUM_THREADS="1")
    saving = ["--save_steps", "2", "--save_total_limit", "10"]
    single = subprocess.run(
        [sys.executable, *command(domain_data, tmp_path / "single", 8, *saving)], env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    pair = subprocess.run(
        [*launch, *command(domain_data, tmp_path / "pair", 4, *saving)], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert pair.returncode == 0, pair.stderr[-3000:]
    for step in range(2, MAX_STEPS + 1, 2):
        name = f"checkpoint-{step}"
        assert positions(tmp_path / "pair" / name) == positions(tmp_path / "single" / name), step
    one, two = logs(tmp_path / "single"), logs(tmp_path / "pair")
    assert len(one) == len(two) == MAX_STEPS
    for first, second in zip(one, two, strict=True):
        for key in [key for key in first if key.startswith(("loss", "task_sampling_weight/", "task_weight/"))]:
            assert second[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), (first["step"], key)
    expected, got = (
        load_file(tmp_path / "single" / "model.safetensors"),
        load_file(tmp_path / "pair" / "model.safetensors"),
    )
    assert all(torch.allclose(expected[name], got[name], atol=1e-4) for name in expected)
