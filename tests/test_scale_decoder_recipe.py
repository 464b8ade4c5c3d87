"""docs/scaling.md's decoder recipe (``accelerate launch``, FSDP2, domains from a column), run as the page writes it.

The page's two blocks marked ``<!-- scaling-recipe: <name> ... -->`` (the Accelerate config file and the launch line)
are read from the page, the config gets 1 machine x 2 CPU processes, and the launch line runs with its variables set
for one node and a tiny model appended. Accelerate runs an FSDP config as DDP on the CPU, so the launched processes get
``tests/fsdp2_on_cpu/sitecustomize.py``, which switches the trainer to Accelerate's FSDP2 path with the plugin the
launcher built from the page's config, and records how the model was sharded.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_port
from processes import REPO_ROOT, TESTS, checkout_env
from safetensors.torch import load_file

PAGE = REPO_ROOT / "docs" / "scaling.md"
HOOK = TESTS / "fsdp2_on_cpu"
DOMAINS = ["code", "news", "numbers"]
#: a tiny run: the model, batch and steps substituted for the page's (later options win)
TINY = (
    "--model_size tiny --vocab_size 300 --max_seq_length 32 --per_device_train_batch_size 2 "
    "--per_device_eval_batch_size 4 --max_steps 4 --warmup_steps 0 --save_steps 2 --logging_steps 1 --use_cpu true"
)


def recipe_blocks() -> dict[str, str]:
    """The page's fenced blocks right after ``<!-- scaling-recipe: <name> ... -->``, by name."""
    found = re.findall(r"<!-- scaling-recipe: (\S+)\b.*?-->\n```\w*\n(.*?)```", PAGE.read_text(), flags=re.S)
    return {name: body for name, body in found}


def one_node_config(text: str, port: int) -> str:
    """The page's config for this machine: 1 machine x 2 CPU processes, everything else as written."""
    config = yaml.safe_load(text)
    config.update(num_machines=1, num_processes=2, machine_rank=0, main_process_ip="127.0.0.1")
    config.update(main_process_port=port, use_cpu=True)
    return yaml.safe_dump(config)


def write_corpus(path: Path, per_domain: int = 40) -> None:
    """A JSON lines corpus whose ``source`` column names 3 domains of short, differently distributed texts."""
    rows = []
    for i in range(per_domain):
        rows.append({"text": f"def f{i}(x):\n    return x * {i} + {i % 7}\n", "source": "code"})
        rows.append({"text": f"The council met on day {i} and voted {i % 3} times on the bridge.", "source": "news"})
        rows.append({"text": " ".join(str((i * 37 + k) % 101) for k in range(12)), "source": "numbers"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_page_has_the_config_file_and_the_launch_line():
    blocks = recipe_blocks()
    assert sorted(blocks) == ["fsdp2_decoder.yaml", "launch"]
    config = yaml.safe_load(blocks["fsdp2_decoder.yaml"])
    assert (config["distributed_type"], config["fsdp_config"]["fsdp_version"]) == ("FSDP", 2)
    assert config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    for option in ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port", "--domain_column"):
        assert option in blocks["launch"]
    assert "--config_file fsdp2_decoder.yaml" in blocks["launch"]


@pytest.mark.slow
def test_the_decoder_recipe_shards_with_fsdp2_logs_per_domain_losses_and_resumes(tmp_path):
    blocks = recipe_blocks()
    port = free_port()
    (tmp_path / "fsdp2_decoder.yaml").write_text(one_node_config(blocks["fsdp2_decoder.yaml"], port))
    (tmp_path / "recipes").symlink_to(REPO_ROOT / "recipes")
    write_corpus(tmp_path / "corpus.jsonl")
    run_dir, record = tmp_path / "run", tmp_path / "record"
    env = checkout_env(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "cache"),
        NNODES="1",
        GPUS_PER_NODE="2",
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        CORPUS=str(tmp_path / "corpus.jsonl"),
        RUN_DIR=str(run_dir),
        FSDP2_ON_CPU_RECORD=str(record),
    )
    env.update(PYTHONPATH=f"{HOOK}{os.pathsep}{env['PYTHONPATH']}", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    command = blocks["launch"].strip() + " " + TINY

    def launch() -> None:
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    launch()
    for rank in (0, 1):
        sharding = json.loads((record / f"fsdp2-rank{rank}-0.json").read_text())
        assert (sharding["distributed_type"], sharding["wrapped_model"]) == ("FSDP", "FSDPLlamaForCausalLM")
        assert sharding["dtensor_parameters"] and sharding["chunked_forward_passes"] > 0
        assert sharding["mixed_precision"] == "bf16"  # the config's, as written
        assert abs(sharding["local_parameters"] - sharding["parameters"] / 2) <= 0.01 * sharding["parameters"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2, 3, 4]
    assert all(f"task_loss/{domain}" in entry for entry in steps for domain in DOMAINS)
    report = json.loads((run_dir / "task_report.json").read_text())
    assert sorted(report["tasks"]) == DOMAINS and sorted(report["eval_task_perplexity"]) == DOMAINS
    shards = sorted(path.name for path in (run_dir / "checkpoint-2" / "pytorch_model_fsdp_0").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    uninterrupted = load_file(run_dir / "model.safetensors")

    shutil.rmtree(run_dir / "checkpoint-4")  # as if the job had died after checkpoint 2
    launch()
    resumed_state = json.loads((run_dir / "trainer_state.json").read_text())
    assert [entry["step"] for entry in resumed_state["log_history"] if "loss" in entry] == [1, 2, 3, 4]
    assert json.loads((record / "fsdp2-rank0-1.json").read_text())["dtensor_parameters"]
    resumed = load_file(run_dir / "model.safetensors")
    assert sorted(resumed) == sorted(uninterrupted)
    assert max(float((resumed[k] - uninterrupted[k]).abs().max()) for k in resumed) <= 1e-6
