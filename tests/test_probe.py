"""Linear probes on frozen features (robust_pretrain.glue.probe) and the suite's ``--family probe``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from robust_pretrain.evaluation import suite
from robust_pretrain.glue import read_predictions
from robust_pretrain.glue.metrics import load_glue_metric
from robust_pretrain.glue.probe import fit_probe, majority_score, make_probe, mean_pooled, task_features
from robust_pretrain.glue.tasks import get_task
from tests.glue_support import make_tiny_bert


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_logistic_probe_minimises_summed_log_loss_plus_half_lambda_squared_norm() -> None:
    # x = +1 (label 1), -1 (label 0): already standardised; by symmetry the intercept is 0. Each point's loss is
    # log(1 + exp(-w)), so the gradient of the objective is -2 sigmoid(-w) + lambda w = 0: lambda = sigmoid(-2) puts
    # the optimum at w = 2 (a mean loss, or C = lambda, would put it elsewhere).
    probe = make_probe(get_task("cola"), _sigmoid(-2.0)).fit(np.array([[1.0], [-1.0]]), np.array([1, 0]))
    linear = probe[-1]
    assert linear.coef_[0, 0] == pytest.approx(2.0, abs=1e-4)
    assert linear.intercept_[0] == pytest.approx(0.0, abs=1e-6)


def test_ridge_probe_minimises_half_squared_error_plus_half_lambda_squared_norm() -> None:
    # x = +1, -1 (standardised), y = 3, 1: intercept = mean(y) = 2; w = x.(y - 2) / (x.x + lambda) = 2 / (2 + 2).
    probe = make_probe(get_task("stsb"), 2.0).fit(np.array([[1.0], [-1.0]]), np.array([3.0, 1.0]))
    assert probe[-1].coef_[0] == pytest.approx(0.5)
    assert probe.predict(np.array([[1.0]]))[0] == pytest.approx(2.5)


def test_standardisation_uses_training_statistics() -> None:
    # Features scaled by 10 and shifted by 5 give the same predictions as the raw ones.
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(40, 3)), np.array([0, 1] * 20)
    raw = make_probe(get_task("rte"), 1.0).fit(features, labels).predict_proba(features)
    moved = make_probe(get_task("rte"), 1.0).fit(10 * features + 5, labels).predict_proba(10 * features + 5)
    np.testing.assert_allclose(raw, moved, atol=1e-6)


def test_cross_validation_breaks_ties_towards_the_strongest_regularisation() -> None:
    # Constant features (standardised to 0): only the intercept is fitted, so every lambda has the same held-out loss.
    labels = np.array([0, 1, 1] * 9)  # 3 stratified folds of 3 zeros and 6 ones
    result = fit_probe(get_task("cola"), np.ones((27, 2)), labels, np.ones((4, 2)), [0.1, 10.0, 1000.0], folds=3)
    assert len(set(result.cv_losses.values())) == 1
    assert result.lambda_ == 1000.0
    # every training fold has 2/3 ones, so the mean held-out loss is the entropy of (1/3, 2/3)
    assert result.cv_losses[0.1] == pytest.approx(-(math.log(2 / 3) * 2 / 3 + math.log(1 / 3) / 3), rel=1e-5)
    np.testing.assert_array_equal(result.predictions, [1, 1, 1, 1])


def test_cross_validation_chooses_by_held_out_loss() -> None:
    # The label depends on feature 0 only; 30 noise features. A tiny lambda overfits, a huge one predicts the base
    # rate: both lose to a middle one, and the choice is the argmin of the recorded losses.
    rng = np.random.default_rng(2)
    features = rng.normal(size=(200, 31))
    labels = (features[:, 0] + 0.5 * rng.normal(size=200) > 0).astype(int)
    result = fit_probe(get_task("mrpc"), features, labels, features[:10], [1e-4, 10.0, 1e6], folds=5)
    assert result.lambda_ == 10.0
    assert result.cv_losses[10.0] == min(result.cv_losses.values())
    assert result.cv_losses[1e6] == pytest.approx(math.log(2), abs=0.01)  # ~ the base rate: labels are balanced
    # regression: squared error of the out-of-fold predictions
    targets = 2 * features[:, 0] + rng.normal(scale=0.1, size=200)
    regression = fit_probe(get_task("stsb"), features, targets, features[:10], [1e-4, 1e6], folds=5)
    assert regression.lambda_ == 1e-4 and regression.cv_losses[1e6] == pytest.approx(np.var(targets), rel=0.05)


@pytest.mark.parametrize(
    ("task", "train", "dev", "expected"),
    [
        ("cola", [1, 1, 0], [0, 1, 1, 0], 0.0),  # constant predictions: MCC 0
        ("rte", [0, 0, 1], [0, 1, 1, 1], 0.25),  # "entailment" (id 0) for all: 1 of 4 right
        ("mrpc", [1, 1, 0], [1, 1, 0, 1], 6 / 7),  # "equivalent" for all: precision 3/4, recall 1
        ("sst2", [0, 1], [1, 1, 0], 1 / 3),  # tie: the lowest id (0)
        ("stsb", [0.5, 4.0], [1.0, 2.0], 0.0),
    ],
)
def test_majority_scores(task: str, train: list, dev: list, expected: float) -> None:
    assert majority_score(get_task(task), np.array(train), np.array(dev)) == pytest.approx(expected)


def test_mean_pooling_ignores_padding_and_keeps_input_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = make_tiny_bert(tmp_path / "tiny")
    model, tokenizer = AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    texts = ["a much longer sentence with many more words in it", "short", "a medium sentence"]
    pooled = mean_pooled(model, tokenizer, texts, max_length=32, batch_size=3)
    for row, text in enumerate(texts):
        alone = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(dim=0)
        np.testing.assert_allclose(pooled[row], alone.detach().numpy(), atol=1e-5)
    pairs = task_features(model, tokenizer, get_task("rte"), {"sentence1": texts, "sentence2": texts[::-1]}, 32, 2)
    u, v = pooled, pooled[::-1]
    np.testing.assert_allclose(pairs, np.concatenate([u, v, np.abs(u - v), u * v], axis=1), atol=1e-6)


@pytest.mark.slow
def test_probe_suite_runs_cells_writes_predictions_and_reuses_them(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    first, second = make_tiny_bert(tmp_path / "tiny-a", seed=0), make_tiny_bert(tmp_path / "tiny-b", seed=1)
    argv = [
        "--family", "probe", "--checkpoints", str(second), "--baseline", str(first), "--tasks", "cola", "stsb",
        "--glue_dir", str(shared_data / "glue"), "--max_train_samples", "60", "--max_eval_samples", "30",
        "--probe_folds", "3", "--probe_lambdas", "1", "100", "--output_dir", str(tmp_path / "suite"),
    ]  # fmt: skip
    summary = suite.run(argv)
    cells = sorted((tmp_path / "suite" / "cells").glob("*/*/seed42/cell.json"))
    assert len(cells) == 4
    for cell_file in cells:
        cell = json.loads(cell_file.read_text())
        task = cell["task"]
        primary = get_task(task).primary_metric
        columns = read_predictions(task, cell_file.parent / f"probe_predictions_{task}.txt")
        assert len(columns["index"]) == 30
        recomputed = load_glue_metric(task).compute(predictions=columns["prediction"], references=columns["label"])
        assert cell["score"] == pytest.approx(100 * recomputed[primary], abs=1e-9)
        details = json.loads((cell_file.parent / "probe.json").read_text())
        assert details["lambda"] in (1.0, 100.0) and details["train_examples"] == 60
        losses = {float(key): loss for key, loss in details["cv_losses"].items()}
        assert details["lambda"] == min(losses, key=lambda key: (losses[key], -key))
        assert f"majority_{primary}" in cell["metrics"]
        assert cell["limits"] == {"max_train_samples": 60, "max_eval_samples": 30}
    table = (tmp_path / "suite" / "probe_suite.md").read_text()
    assert "linear probes on frozen mean-pooled features" in table and "Δ worst" in table
    assert summary["checkpoints"][str(second)]["worst_task"] in ("cola", "stsb")
    stamps = {path: path.stat().st_mtime_ns for path in cells}
    suite.run(argv)  # every cell reused
    assert {path: path.stat().st_mtime_ns for path in cells} == stamps
    changed = argv.copy()
    changed.remove("100")  # one lambda less: a setting of every cell
    suite.run(changed)
    assert all(path.stat().st_mtime_ns != stamps[path] for path in cells)
