"""Frozen-encoder linear probes on GLUE tasks: a downstream measure without fine-tuning seeds.

Features: the frozen encoder's last hidden states, mean-pooled over the attention mask (a sentence pair: the two
sentences encoded separately, ``[u, v, |u - v|, u * v]`` as in SentEval). A probe: the features standardised with
training statistics, then L2-regularised logistic regression (a regression task such as STS-B: ridge regression),
both minimising ``sum of per-example losses + lambda / 2 * ||w||^2`` (log loss; half the squared error), the intercept
unpenalised. ``lambda`` is chosen from a fixed grid by k-fold cross-validation on the training set only, by the
probe's own held-out loss (out-of-fold log loss; squared error for regression; ties go to the stronger
regularisation): a proper scoring rule that, unlike F1 or accuracy, does not reward collapsing towards the majority
class. The probe is then refitted on the whole training set and scored once on the dev set with the task's metric.
Nothing is random except the fold assignment, which is fixed (``random_state=0``), so a probe is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModel, PreTrainedModel, PreTrainedTokenizerBase

from robust_pretrain.glue.metrics import load_glue_metric
from robust_pretrain.glue.tasks import GlueTask
from robust_pretrain.options import check_options, option

DEFAULT_LAMBDAS = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5)
#: How ``lambda`` is chosen (part of every probe cell's settings).
SELECTION = "min out-of-fold log loss (regression: squared error), ties to the larger lambda"


@dataclass
class ProbeArguments:
    """Data, encoding and regularisation of the linear probes; ``output_dir`` is the suite directory."""

    output_dir: str | None = field(default=None, metadata={"help": "Suite directory (cells, tables, model cards)."})
    glue_dir: str | None = option(
        None, "Directory in the original GLUE TSV layout (<dir>/<TASK>/train.tsv, dev.tsv); default: Hub.", path="dir"
    )
    max_seq_length: int = option(128, "Truncate each sentence to this many tokens.", minimum=1)
    max_train_samples: int | None = option(None, "Use only the first N training examples.", minimum=1)
    max_eval_samples: int | None = option(None, "Use only the first N dev examples.", minimum=1)
    encode_batch_size: int = option(64, "Sentences per forward pass of the frozen encoder.", minimum=1)
    probe_lambdas: list[float] = option(
        default_factory=lambda: list(DEFAULT_LAMBDAS),
        help="L2 strengths lambda the cross-validation chooses from (objective: summed loss + lambda/2 ||w||^2).",
        above=0,
    )
    probe_folds: int = option(5, "Cross-validation folds on the training set that choose lambda.", minimum=2)
    cache_dir: str | None = field(default=None, metadata={"help": "Cache directory for Hub downloads."})

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class ProbeResult:
    """Dev predictions of the refitted probe, the chosen ``lambda_`` and each lambda's cross-validated loss."""

    predictions: np.ndarray
    lambda_: float
    cv_losses: dict[float, float]


def mean_pooled(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int,
    batch_size: int,
) -> np.ndarray:
    """``(len(texts), hidden)`` float32 features: last hidden states averaged over each text's real tokens. Texts are
    batched by token length (less padding), results returned in input order."""
    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    features = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = tokenizer(
                [texts[i] for i in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            features[rows] = ((hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)).float().numpy()
    return features


def task_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: GlueTask,
    columns: dict[str, Sequence[str]],
    max_length: int,
    batch_size: int,
) -> np.ndarray:
    """One feature row per example: the sentence's features, or ``[u, v, |u - v|, u * v]`` for a sentence pair."""
    encoded = [mean_pooled(model, tokenizer, columns[name], max_length, batch_size) for name in spec.text_columns]
    if len(encoded) == 1:
        return encoded[0]
    u, v = encoded
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def load_encoder(checkpoint: str, cache_dir: str | None = None) -> PreTrainedModel:
    """The checkpoint's base encoder (an MLM or classification head, if saved, is dropped), in float32."""
    return AutoModel.from_pretrained(checkpoint, cache_dir=cache_dir, dtype=torch.float32)


def make_probe(spec: GlueTask, lambda_: float) -> Pipeline:
    """Standardisation + the task's linear model for ``lambda_`` (see the module docstring for the objective)."""
    if spec.is_regression:
        model = Ridge(alpha=lambda_)
    else:
        model = LogisticRegression(C=1.0 / lambda_, max_iter=5000, tol=1e-6)
    return make_pipeline(StandardScaler(), model)


def score_predictions(spec: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's metrics of ``predictions`` (``evaluate`` module shipped with the project), unscaled."""
    return load_glue_metric(spec.name).compute(predictions=predictions, references=labels)


def _folds(spec: GlueTask, labels: np.ndarray, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    splitter = KFold if spec.is_regression else StratifiedKFold
    return list(splitter(n_splits=count, shuffle=True, random_state=0).split(np.zeros(len(labels)), labels))


def fit_probe(
    spec: GlueTask,
    train_features: np.ndarray,
    train_labels: np.ndarray,
    eval_features: np.ndarray,
    lambdas: Sequence[float],
    folds: int,
) -> ProbeResult:
    """Choose lambda by ``folds``-fold cross-validation on the training set (:data:`SELECTION`), refit on all of it,
    predict the dev features."""
    splits = _folds(spec, train_labels, folds)
    cv_losses = {}
    for lambda_ in sorted(lambdas):
        losses = np.empty(len(train_labels), dtype=np.float64)
        for fit_rows, held_out in splits:
            probe = make_probe(spec, lambda_).fit(train_features[fit_rows], train_labels[fit_rows])
            losses[held_out] = _example_losses(spec, probe, train_features[held_out], train_labels[held_out])
        cv_losses[float(lambda_)] = float(losses.mean())
    best = min(cv_losses.values())
    chosen = max(lambda_ for lambda_, loss in cv_losses.items() if loss == best)
    probe = make_probe(spec, chosen).fit(train_features, train_labels)
    return ProbeResult(predictions=probe.predict(eval_features), lambda_=chosen, cv_losses=cv_losses)


def _example_losses(spec: GlueTask, probe: Pipeline, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example held-out loss: squared error, or the negative log probability of the true label."""
    if spec.is_regression:
        return (probe.predict(features) - labels) ** 2
    columns = np.searchsorted(probe.classes_, labels)  # stratified folds: every class is in every training fold
    return -np.log(np.clip(probe.predict_proba(features)[np.arange(len(labels)), columns], 1e-300, None))


def majority_score(spec: GlueTask, train_labels: np.ndarray, eval_labels: np.ndarray) -> float:
    """The primary metric (unscaled) of predicting the training set's most frequent label for every dev example (the
    lowest label id on a tie); 0 for a regression task (a constant has no correlation with the labels)."""
    if spec.is_regression:
        return 0.0
    majority = np.bincount(train_labels.astype(int), minlength=spec.num_labels).argmax()
    predictions = np.full(len(eval_labels), majority)
    return float(score_predictions(spec, predictions, eval_labels)[spec.primary_metric])
