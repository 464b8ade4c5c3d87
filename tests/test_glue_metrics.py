"""The shipped evaluate module gives the same numbers as scikit-learn/scipy; compute_metrics maps logits to labels."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from transformers import EvalPrediction

from robust_pretrain.glue import GLUE_TASKS, get_task, load_glue_metric
from robust_pretrain.glue.finetune import build_compute_metrics


def _reference(task: str, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    if task == "cola":
        return {"matthews_correlation": matthews_corrcoef(references, predictions)}
    if task == "stsb":
        return {"pearson": pearsonr(predictions, references)[0], "spearmanr": spearmanr(predictions, references)[0]}
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy_score(references, predictions), "f1": f1_score(references, predictions)}
    return {"accuracy": accuracy_score(references, predictions)}


def _sample(task: str, rng: np.random.Generator, size: int = 200) -> tuple[np.ndarray, np.ndarray]:
    if task == "stsb":
        references = rng.uniform(0, 5, size)
        return references + rng.normal(0, 1.5, size), references
    num_labels = get_task(task).num_labels
    references = rng.integers(0, num_labels, size)
    noisy = np.where(rng.random(size) < 0.3, rng.integers(0, num_labels, size), references)
    return noisy, references


@pytest.mark.parametrize("task", list(GLUE_TASKS))
def test_metric_module_matches_sklearn_scipy(task: str) -> None:
    rng = np.random.default_rng(len(task))
    predictions, references = _sample(task, rng)
    result = load_glue_metric(task).compute(predictions=predictions, references=references)
    expected = _reference(task, predictions, references)
    assert set(result) == set(expected) == set(get_task(task).metrics)
    for name, value in expected.items():
        assert result[name] == pytest.approx(float(value), abs=1e-12), name
        assert 0.2 < abs(result[name]) < 1.0  # informative sample: neither chance nor perfect


def test_metric_module_rejects_unknown_config() -> None:
    import evaluate

    from robust_pretrain.glue import GLUE_METRIC_PATH

    with pytest.raises(ValueError, match="unknown task 'squad'"):
        evaluate.load(GLUE_METRIC_PATH, "squad")


def test_compute_metrics_argmax_and_regression() -> None:
    logits = np.array([[2.0, -1.0], [0.1, 0.3], [-1.0, 1.0], [0.5, 0.4]])
    labels = np.array([0, 1, 0, 0])
    metrics = build_compute_metrics(get_task("mrpc"))(EvalPrediction(predictions=logits, label_ids=labels))
    assert metrics == {"accuracy": pytest.approx(0.75), "f1": pytest.approx(f1_score(labels, [0, 1, 1, 0]))}
    scores = np.array([[0.5], [2.0], [4.5], [3.0]])
    gold = np.array([1.0, 2.0, 5.0, 2.5])
    metrics = build_compute_metrics(get_task("stsb"))(EvalPrediction(predictions=scores, label_ids=gold))
    assert metrics["spearmanr"] == pytest.approx(spearmanr(scores[:, 0], gold)[0])
    assert metrics["pearson"] == pytest.approx(pearsonr(scores[:, 0], gold)[0])
