"""A checkpoint written by ``recipes/pretrain_pos_mlm.py`` is a plain ``transformers`` model: it loads for sequence
classification without custom code and fine-tunes with the stock ``Trainer`` (GitHub issue 4)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_recipe_pretrain import _one_thread, pretrained_run  # noqa: F401  (fixtures; the shared run)
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)


def sst2_rows(shared_data: Path, n: int) -> list[tuple[str, int]]:
    with open(shared_data / "glue" / "SST-2" / "train.tsv", newline="") as f:
        rows = [(r["sentence"], int(r["label"])) for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    positives = [r for r in rows if r[1] == 1][: n // 2]
    negatives = [r for r in rows if r[1] == 0][: n - n // 2]
    return [row for pair in zip(positives, negatives, strict=True) for row in pair]


@pytest.mark.slow
def test_checkpoint_fine_tunes_on_sst2(pretrained_run, shared_data: Path, tmp_path: Path) -> None:  # noqa: F811
    checkpoint, _ = pretrained_run
    config = json.loads((checkpoint / "config.json").read_text())
    assert "auto_map" not in config and config["architectures"] == ["BertForMaskedLM"]  # no custom code needed

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    assert type(model).__name__ == "BertForSequenceClassification"
    # the encoder is the pre-trained one, not a fresh initialisation
    pretrained = AutoModelForMaskedLM.from_pretrained(checkpoint).state_dict()
    encoder = {k: v for k, v in model.state_dict().items() if k.startswith("bert.encoder.")}
    assert len(encoder) > 20
    for key, value in encoder.items():
        torch.testing.assert_close(value, pretrained[key], msg=key)

    rows = sst2_rows(shared_data, 16)
    assert len(rows) == 16 and {label for _, label in rows} == {0, 1}
    dataset = [
        {**tokenizer(text, truncation=True, max_length=64), "labels": label} for text, label in rows
    ]  # a list of dicts is a valid Trainer dataset
    args = TrainingArguments(
        output_dir=str(tmp_path / "sst2"),
        max_steps=6,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    prediction = trainer.predict(dataset)
    assert prediction.predictions.shape == (16, 2)
    assert np.isfinite(prediction.predictions).all()
    after = prediction.metrics["test_loss"]
    assert math.isfinite(before) and after < before  # fitting 16 rows for 6 steps lowers their loss
    assert before == pytest.approx(math.log(2), abs=0.35)  # a fresh classifier head starts near chance
