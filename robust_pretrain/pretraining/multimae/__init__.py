"""Task-robust multi-modal masked-autoencoder pre-training (``robust-pretrain-multimae``): :mod:`.recipe` (the run and
its console entry), :mod:`.arguments` (options and the settings a resumed run must share), :mod:`.data` (images,
checks, masking collators) and :mod:`.model` (model set-up)."""
