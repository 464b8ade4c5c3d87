"""Simulated 2 nodes x 1 process (two ``torchrun --nnodes 2 --node_rank 0/1`` rendezvousing on 127.0.0.1) running
the real PoS recipe ends with the parameters of 1 node x 2 processes; only the global main process writes outputs.

Each simulated node gets its own output folder and its own datasets cache (``HF_HOME``), as on machines without a
shared file system: each node's local main process preprocesses into its own cache (``main_process_first``, local),
and nothing the run publishes (model, card, report, plot, run config) appears on node 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port
from processes import checkout_env
from safetensors.torch import load_file

from robust_pretrain.data import load_ewt_corpus
from robust_pretrain.pretraining.pos_mlm.model import train_wordpiece_tokenizer

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "pretrain_pos_mlm.py"
PUBLISHED = ("model.safetensors", "config.json", "README.md", "task_report.json", "task_weights.png", "run_config.json")
TINY = [
    "--config", str(REPO / "recipes" / "configs" / "demo.yaml"),
    "--max_steps", "3", "--warmup_steps", "0", "--model_size", "tiny", "--max_seq_length", "64",
    "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "16", "--max_eval_samples", "32",
    "--logging_steps", "2", "--save_steps", "2", "--disable_tqdm", "true",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """A small training text, held-out text and a WordPiece tokenizer trained on the former (both runs and both nodes
    use the same)."""
    folder = tmp_path_factory.mktemp("data")
    texts = load_ewt_corpus("train")["text"][:120]
    (folder / "train.txt").write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n")
    # every task must have held-out words: the first EWT test texts have no interjection, hence the "oh"
    held_out = [t.replace("\n", " ") + " Oh , thanks ." for t in load_ewt_corpus("test")["text"][:32]]
    (folder / "valid.txt").write_text("\n".join(held_out) + "\n")
    train_wordpiece_tokenizer(texts, 600).save_pretrained(folder / "tokenizer")
    return {
        "train_file": folder / "train.txt",
        "validation_file": folder / "valid.txt",
        "tokenizer": folder / "tokenizer",
    }


def recipe_args(output_dir: Path, data: dict[str, Path]) -> list[str]:
    return [
        *TINY,
        "--output_dir", str(output_dir),
        "--train_file", str(data["train_file"]),
        "--validation_file", str(data["validation_file"]),
        "--tokenizer_name", str(data["tokenizer"]),
    ]  # fmt: skip


def torchrun(*options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *options, str(RECIPE)]


def env_for(home: Path) -> dict[str, str]:
    return checkout_env(OMP_NUM_THREADS="1", HF_HOME=str(home), HF_DATASETS_CACHE=str(home / "datasets"))


@pytest.mark.slow
def test_two_nodes_of_one_process_equal_one_node_of_two(tmp_path, data):
    single = tmp_path / "one-node"
    result = subprocess.run(
        [*torchrun("--nproc_per_node", "2", "--master_port", str(free_port())), *recipe_args(single, data)],
        env=env_for(tmp_path / "home-single"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    port = str(free_port())
    nodes = []
    for rank in (0, 1):
        launch = torchrun(
            "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", port,
        )  # fmt: skip
        nodes.append(
            subprocess.Popen(
                [*launch, *recipe_args(tmp_path / f"node{rank}", data)],
                env=env_for(tmp_path / f"home-node{rank}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]

    states = [single / "trainer_state.json", tmp_path / "node0" / "trainer_state.json"]
    logged = [json.loads(state.read_text())["log_history"] for state in states]
    assert logged[0][:-1] == logged[1][:-1]  # losses, task losses and weights of every logged step (not run times)
    reference = load_file(single / "model.safetensors")
    multinode = load_file(tmp_path / "node0" / "model.safetensors")
    assert reference.keys() == multinode.keys()
    assert max(float((reference[k] - multinode[k]).abs().max()) for k in reference) == 0.0
    for name in PUBLISHED:
        assert (tmp_path / "node0" / name).is_file(), name
    node1_files = sorted(str(p.relative_to(tmp_path / "node1")) for p in (tmp_path / "node1").rglob("*") if p.is_file())
    assert not [f for f in node1_files if Path(f).name in PUBLISHED], node1_files
    # the Trainer saves each process's RNG state where that process runs: node 1 holds only its own
    assert all(Path(f).name == "rng_state_1.pth" for f in node1_files), node1_files
    # each node tagged the corpus into its own cache (local main process first), node 1 included
    for rank in (0, 1):
        assert list((tmp_path / f"home-node{rank}" / "datasets").rglob("cache-*.arrow")), f"node {rank} cache"
