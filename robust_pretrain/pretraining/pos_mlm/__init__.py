"""Task-robust masked-LM pre-training over part-of-speech tasks (``robust-pretrain-pos-mlm``): :mod:`.recipe` (the run
and its console entry), :mod:`.arguments` (options and the settings a resumed run must share), :mod:`.data` (loading,
tagging, checks, masking collators) and :mod:`.model` (tokenizer and model set-up)."""
