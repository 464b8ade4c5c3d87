"""GLUE task metrics as an ``evaluate`` module, shipped with robust-pretrain so it loads offline by path.

Usage: ``evaluate.load("<path to this folder>", "<task>")`` with task in cola, sst2, mrpc, stsb, qqp, mnli,
mnli_matched, mnli_mismatched, qnli, rte, wnli; then ``compute(predictions=..., references=...)``.
Scores are on a 0-1 scale: CoLA ``matthews_correlation``; MRPC/QQP ``accuracy`` and ``f1`` (positive class 1);
STS-B ``pearson`` and ``spearmanr``; every other task ``accuracy``.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_TASKS = (
    "cola",
    "sst2",
    "mrpc",
    "stsb",
    "qqp",
    "mnli",
    "mnli_matched",
    "mnli_mismatched",
    "qnli",
    "rte",
    "wnli",
)

_INPUTS = """
Args:
    predictions: predicted label ids (float scores for stsb).
    references: gold label ids (float scores for stsb).
Returns:
    dict of floats in [0, 1] ([-1, 1] for correlations), keys depending on the task (see the module docstring).
"""


class GlueMetric(evaluate.Metric):
    """Official GLUE scores per task, computed with scikit-learn and scipy."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in _TASKS:
            raise ValueError(f"GLUE metric: unknown task {self.config_name!r}; expected one of {list(_TASKS)}")
        value = datasets.Value("float64" if self.config_name == "stsb" else "int64")
        return evaluate.MetricInfo(
            description="GLUE task metrics (robust-pretrain, offline).",
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": value, "references": value}),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name == "stsb":
            return {
                "pearson": float(pearsonr(predictions, references)[0]),
                "spearmanr": float(spearmanr(predictions, references)[0]),
            }
        accuracy = float(accuracy_score(references, predictions))
        if self.config_name in ("mrpc", "qqp"):
            return {"accuracy": accuracy, "f1": float(f1_score(references, predictions))}
        return {"accuracy": accuracy}
