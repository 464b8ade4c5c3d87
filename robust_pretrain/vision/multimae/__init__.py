"""The MM-MAE model, in transformers' ``models/<name>/`` layout: :mod:`.configuration_multimae`,
:mod:`.modeling_multimae` (the module the Auto classes import: it registers the models),
:mod:`.image_processing_multimae` and the model's parts (:mod:`.encoder`, :mod:`.decoder`, :mod:`.pretraining`,
:mod:`.heads`, :mod:`.convnext_head`, :mod:`.losses`, :mod:`.patch_grid`, :mod:`.modality_values`), the ViT export
(:mod:`.export`), LoRA outputs (:mod:`.lora`) and the Auto-class hook (:mod:`.auto_registration`).

Importing this package imports nothing (the package root installs the hook from here and stays light); the public
names are exported by :mod:`robust_pretrain.vision`.
"""
