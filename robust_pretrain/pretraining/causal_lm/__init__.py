"""Domain-robust causal-LM pre-training (``robust-pretrain-causal-lm``): :mod:`.recipe` (the run and its console entry),
:mod:`.arguments` (options and the settings a resumed run must share), :mod:`.data` (domain texts, checks, packing)
and :mod:`.model` (tokenizer and model set-up)."""
