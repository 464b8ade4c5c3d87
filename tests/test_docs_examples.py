"""The Python examples of the docs run as written: each is read from its page and executed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robust_pretrain.data.domains import EWT_GENRES, ewt_genre_texts

DOCS = Path(__file__).resolve().parents[1] / "docs"


def docs_example(page: str, marker: str) -> str:
    """The ```python block right after ``<!-- marker ... -->`` on ``docs/<page>``."""
    match = re.search(rf"<!-- {marker}\b.*?-->\n```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)
    assert match is not None, f"docs/{page} has no python block marked {marker}"
    return match.group(1)


@pytest.mark.slow
def test_the_decoder_over_three_domain_files_runs_as_written(tmp_path, monkeypatch):
    """docs/decoder.md's script: no task_names given and no sampling object wired by hand; the trainer takes the
    domains from the collator, draws them online and logs the sampling weights."""
    corpus = ewt_genre_texts("train")
    (tmp_path / "data").mkdir()
    for name, genre in (("web", "weblog"), ("mail", "email"), ("reviews", "reviews")):
        genre_texts = [t for t, d in zip(corpus["text"], corpus["domain"], strict=True) if d == EWT_GENRES.index(genre)]
        lines = [" ".join(text.split()) for text in genre_texts[:60]]
        (tmp_path / "data" / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(docs_example("decoder.md", "decoder-python-example"), "docs/decoder.md", "exec"), namespace)
    trainer, names = namespace["trainer"], ["web", "mail", "reviews"]
    assert trainer.task_names == names and trainer.state.global_step == 20
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    sampling = [[entry[f"task_sampling_weight/{name}"] for name in names] for entry in logs]
    assert len(sampling) == 4 and all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in sampling)
    assert sampling[-1] == pytest.approx(trainer.task_schedule.weights_at(20).tolist(), abs=1e-6)
    assert sampling[-1] != pytest.approx([1 / 3] * 3, abs=1e-4)  # minimax moved them


@pytest.mark.slow
def test_the_quickstart_and_its_lora_variant_run_as_written(tmp_path, monkeypatch):
    """docs/quickstart.md's script (no ``remove_unused_columns``: the trainer keeps the collator's columns), then its
    LoRA continuation: only the adapters and the head train, under minimax task weights."""
    import torch

    monkeypatch.setenv("ROBUST_PRETRAIN_UD_DIR", str(DOCS.parents[1] / "shared" / "data" / "ud_ewt"))
    monkeypatch.chdir(tmp_path)  # the outputs land here, not in the checkout
    namespace: dict = {}
    exec(compile(docs_example("quickstart.md", "quickstart-example"), "docs/quickstart.md", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 30
    assert "eval_worst_task_loss" in namespace["trainer"].evaluate()
    exec(compile(docs_example("quickstart.md", "quickstart-lora-example"), "docs/quickstart.md", "exec"), namespace)
    model, trainer = namespace["model"], namespace["trainer"]
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name or ".cls." in name for name in trainable)
    frozen = dict(model.get_base_model().named_parameters())["bert.encoder.layer.0.attention.self.key.weight"]
    assert not frozen.requires_grad
    logged = [entry for entry in trainer.state.log_history if "task_weight/noun" in entry]
    assert trainer.state.global_step == 30 and len(logged) == 3
    weights = torch.tensor([logged[-1][f"task_weight/{t}"] for t in trainer.task_names])
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-5) and weights.std() > 1e-3  # minimax, not uniform
    assert (tmp_path / "outputs" / "quickstart-lora" / "adapter" / "adapter_config.json").is_file()
