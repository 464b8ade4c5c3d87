"""Everything a run writes besides its model: reports, model cards, plots and the aggregation of per-task results.

* ``task_report`` — a pre-training run's ``task_report.json`` (final weights, held-out loss per task, worst task).
* ``scoring`` — scale-free worst-case scores of per-task losses: raw, signed excess over a reference, regret
  against a baseline, each with its mean and its worst task named.
* ``aggregation`` — per-task results over seeds and checkpoints: mean ± std, average, worst task named, deltas
  against a baseline and their size in standard errors (the suite, the comparison and the evidence tables).
* ``cards`` — the one model-card renderer: pre-training cards (one template for every task family: PoS groups,
  image modalities, and any later family such as causal LM), fine-tuning cards (GLUE and dense) and card metadata.
* ``suite_cards`` — suite results as ``model-index`` metadata (imported by its path: it needs the evaluation
  package).
* ``plots`` — every figure, with one colour rule per modality (RGB, depth, class maps).
* ``tables`` — the Markdown tables of the suite and of the comparison of strategies.

Importing this package loads neither torch nor transformers (the publish command renders cards without them).
"""

from robust_pretrain.reference import model_size
from robust_pretrain.reporting.cards import (
    CARD_CONTENT_NAME,
    EWT_TRAINING_DATA,
    CardTaskFamily,
    FineTunedMetric,
    FineTuningCardContent,
    ModelCardContent,
    TrainingData,
    build_model_card,
    card_renderer,
    card_text_for_repo,
    checkpoint_tokenizer,
    hub_dataset,
    local_files,
    modality_tasks,
    pos_tasks,
    render_finetuning_card,
    render_model_card,
    trained_tokenizer,
)
from robust_pretrain.reporting.plots import plot_task_trajectories, trajectory_figure
from robust_pretrain.reporting.task_report import (
    TASK_REPORT_NAME,
    TRAJECTORY_PLOT_NAME,
    task_report,
    write_task_report,
)

__all__ = [
    "CARD_CONTENT_NAME",
    "CardTaskFamily",
    "EWT_TRAINING_DATA",
    "FineTunedMetric",
    "FineTuningCardContent",
    "TASK_REPORT_NAME",
    "TRAJECTORY_PLOT_NAME",
    "ModelCardContent",
    "TrainingData",
    "build_model_card",
    "card_renderer",
    "card_text_for_repo",
    "checkpoint_tokenizer",
    "hub_dataset",
    "local_files",
    "modality_tasks",
    "model_size",
    "plot_task_trajectories",
    "pos_tasks",
    "render_finetuning_card",
    "render_model_card",
    "task_report",
    "trained_tokenizer",
    "trajectory_figure",
    "write_task_report",
]
