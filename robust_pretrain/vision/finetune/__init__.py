"""Dense fine-tuning of an MM-MAE or ViT checkpoint (``robust-pretrain-finetune-dense``): :mod:`.recipe` (the run and
its console entry), :mod:`.arguments` (options), :mod:`.data` (images and their checks), :mod:`.model` (checkpoint,
task model, LoRA, parameter groups), :mod:`.trainer` (collator, Trainer scoring at each label's size) and
:mod:`.metrics` (scores and prediction files)."""
