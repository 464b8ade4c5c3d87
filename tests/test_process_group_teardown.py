"""A finished distributed run leaves no process group alive at interpreter exit (gloo's threads otherwise abort a
finished rank now and then: ``terminate called without an active exception``, exit -6, and torchrun fails)."""

import subprocess
import sys
import textwrap

import pytest
from ports import free_port
from processes import checkout_env

WORKER = """
import atexit, os, sys
import torch
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert
from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

out = sys.argv[1]

def report():  # registered first, so it runs after every handler registered later (atexit is last in, first out)
    with open(f"{out}/exit-{os.environ['RANK']}.txt", "w") as f:
        f.write(str(torch.distributed.is_initialized()))

atexit.register(report)
args = MinimaxTrainingArguments(output_dir=out, task_names=TASKS, per_device_train_batch_size=4, max_steps=1,
                                use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True)
assert torch.distributed.is_initialized() and torch.distributed.get_world_size() == 2
MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(8))).train()
"""


@pytest.mark.slow
def test_the_process_group_is_destroyed_before_interpreter_exit(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    result = subprocess.run(
        [*launch, str(script), str(tmp_path)],
        env=checkout_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # the report ran after the trainer's teardown handler: no rank still had a process group
    assert [(tmp_path / f"exit-{rank}.txt").read_text() for rank in (0, 1)] == ["False", "False"]
