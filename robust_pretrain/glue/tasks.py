"""GLUE task registry: Hub schema (`nyu-mll/glue`), original TSV layout, metrics and the suite's primary score."""

from __future__ import annotations

from dataclasses import dataclass, field

from robust_pretrain.cli import UsageError

# Hub split names -> file names in the original GLUE download.
_DEV = {"validation": "dev.tsv"}


@dataclass(frozen=True)
class GlueTask:
    """Everything the recipes need to know about one GLUE task.

    ``text_columns`` and ``label_names`` follow the Hub dataset ``nyu-mll/glue`` (label id = position in
    ``label_names``; ``None`` means regression). ``tsv_columns`` maps each Hub column to its TSV header name (or to
    its 0-based column position when ``tsv_header`` is false); ``tsv_label_values`` lists the raw TSV label strings
    in label-id order.
    """

    name: str
    glue_dir_name: str
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    tsv_header: bool
    tsv_columns: dict[str, str | int]
    tsv_label_values: tuple[str, ...] | None
    metrics: tuple[str, ...]
    primary_metric: str
    eval_files: dict[str, str] = field(default_factory=lambda: dict(_DEV))

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """Hub split names evaluated, the first one is the task's main evaluation split."""
        return tuple(self.eval_files)


#: the GLUE tasks by name: files, columns, label count and metric of each
GLUE_TASKS: dict[str, GlueTask] = {
    spec.name: spec
    for spec in (
        GlueTask(
            name="cola",
            glue_dir_name="CoLA",
            text_columns=("sentence",),
            label_names=("unacceptable", "acceptable"),
            tsv_header=False,
            tsv_columns={"sentence": 3, "label": 1},
            tsv_label_values=("0", "1"),
            metrics=("matthews_correlation",),
            primary_metric="matthews_correlation",
        ),
        GlueTask(
            name="sst2",
            glue_dir_name="SST-2",
            text_columns=("sentence",),
            label_names=("negative", "positive"),
            tsv_header=True,
            tsv_columns={"sentence": "sentence", "label": "label"},
            tsv_label_values=("0", "1"),
            metrics=("accuracy",),
            primary_metric="accuracy",
        ),
        GlueTask(
            name="mrpc",
            glue_dir_name="MRPC",
            text_columns=("sentence1", "sentence2"),
            label_names=("not_equivalent", "equivalent"),
            tsv_header=True,
            tsv_columns={"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"},
            tsv_label_values=("0", "1"),
            metrics=("accuracy", "f1"),
            primary_metric="f1",
        ),
        GlueTask(
            name="stsb",
            glue_dir_name="STS-B",
            text_columns=("sentence1", "sentence2"),
            label_names=None,
            tsv_header=True,
            tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"},
            tsv_label_values=None,
            metrics=("pearson", "spearmanr"),
            primary_metric="spearmanr",
        ),
        GlueTask(
            name="qqp",
            glue_dir_name="QQP",
            text_columns=("question1", "question2"),
            label_names=("not_duplicate", "duplicate"),
            tsv_header=True,
            tsv_columns={"question1": "question1", "question2": "question2", "label": "is_duplicate"},
            tsv_label_values=("0", "1"),
            metrics=("accuracy", "f1"),
            primary_metric="f1",
        ),
        GlueTask(
            name="mnli",
            glue_dir_name="MNLI",
            text_columns=("premise", "hypothesis"),
            label_names=("entailment", "neutral", "contradiction"),
            tsv_header=True,
            tsv_columns={"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"},
            tsv_label_values=("entailment", "neutral", "contradiction"),
            metrics=("accuracy",),
            primary_metric="accuracy",
            eval_files={"validation_matched": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
        ),
        GlueTask(
            name="qnli",
            glue_dir_name="QNLI",
            text_columns=("question", "sentence"),
            label_names=("entailment", "not_entailment"),
            tsv_header=True,
            tsv_columns={"question": "question", "sentence": "sentence", "label": "label"},
            tsv_label_values=("entailment", "not_entailment"),
            metrics=("accuracy",),
            primary_metric="accuracy",
        ),
        GlueTask(
            name="rte",
            glue_dir_name="RTE",
            text_columns=("sentence1", "sentence2"),
            label_names=("entailment", "not_entailment"),
            tsv_header=True,
            tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
            tsv_label_values=("entailment", "not_entailment"),
            metrics=("accuracy",),
            primary_metric="accuracy",
        ),
        GlueTask(
            name="wnli",
            glue_dir_name="WNLI",
            text_columns=("sentence1", "sentence2"),
            label_names=("not_entailment", "entailment"),
            tsv_header=True,
            tsv_columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
            tsv_label_values=("0", "1"),
            metrics=("accuracy",),
            primary_metric="accuracy",
        ),
    )
}


def get_task(name: str) -> GlueTask:
    """Look a task up by name (case-insensitive, ``sst-2``/``sts-b`` spellings accepted)."""
    key = name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise UsageError(f"Unknown GLUE task {name!r}; expected one of: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def primary_score(task: str | GlueTask, eval_metrics: dict[str, float]) -> float:
    """The task's single suite score on a 0-100 scale, read from ``eval_<metric>`` keys of the eval results.

    CoLA: Matthews correlation; STS-B: Spearman correlation; MRPC/QQP: F1 (BERT-paper convention); MNLI: matched
    accuracy; every other task: accuracy.
    """
    spec = task if isinstance(task, GlueTask) else get_task(task)
    key = f"eval_{spec.primary_metric}"
    if key not in eval_metrics:
        raise KeyError(f"{spec.name}: eval results have no {key!r} (keys: {sorted(eval_metrics)})")
    return 100.0 * float(eval_metrics[key])
