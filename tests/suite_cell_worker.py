"""torchrun worker for tests/test_glue_suite.py: one suite cell whose main process writes its predictions late."""

import sys
import time
from pathlib import Path

from accelerate import PartialState

from robust_pretrain.evaluation.suite import run_cell
from robust_pretrain.evaluation.tasks import ModelIndexTarget, RunSettings, SuiteTask, TaskRunResult
from robust_pretrain.glue.finetune import GlueTrainingArguments

PREDICTIONS = "predict_results_late.txt"


def run_late(*, checkpoint: str, seed: int, output_dir: Path, options, save_model: bool) -> TaskRunResult:
    if PartialState().is_main_process:  # as Trainer.predict's writers: the main process alone, after the others
        time.sleep(2.0)
        (output_dir / PREDICTIONS).write_text("index\tprediction\n0\t1\n")
    return TaskRunResult(metrics={"accuracy": 100.0}, prediction_files=(PREDICTIONS,))


if __name__ == "__main__":
    GlueTrainingArguments(output_dir=sys.argv[1])  # joins the process group, as the suite's parsed options do
    target = ModelIndexTarget("text-classification", "late", "Late", "validation")
    task = SuiteTask("late", "test", "Late", "accuracy", run_late, {"accuracy": ("accuracy", target)})
    cell = run_cell("ckpt", task, 0, (), RunSettings(settings={}, limits={}), Path(sys.argv[1]))
    rank = PartialState().process_index  # a file per rank: the ranks' prints could interleave on one line
    (Path(sys.argv[1]) / f"rank{rank}.txt").write_text(f"rank {rank}: score {cell['score']}\n")
