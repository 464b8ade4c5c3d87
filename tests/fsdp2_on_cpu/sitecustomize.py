"""Test-only start-up hook: Accelerate's FSDP2 path forced onto the CPU processes of an ``accelerate launch``.

Accelerate never shards on the CPU: launched with an FSDP config and ``use_cpu: true`` it runs plain DDP (see
docs/scaling.md, "FSDP"). With this folder first on ``PYTHONPATH``, every process the launcher starts (``LOCAL_RANK``
set, ``ACCELERATE_USE_FSDP=true``) switches each ``MinimaxTrainer``, once built, to Accelerate's FSDP2 path with the
plugin that the launcher's ``FSDP_*`` variables describe (the config file's ``fsdp_config``), as
``tests/tiny_training.py``'s ``force_fsdp2`` does, so ``Trainer.train`` shards the model with Accelerate's own
``fsdp2_prepare_model`` and writes sharded checkpoints. Each process records in ``$FSDP2_ON_CPU_RECORD``
``fsdp2-rank<r>-<n>.json`` (``n``: the n-th training of that folder) how the model was prepared: its class, the mixed
precision, whether every parameter is a DTensor shard, the parameters it holds, and the chunked loss's forward passes.
"""

import json
import os
from pathlib import Path

if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and "LOCAL_RANK" in os.environ:
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.distributed.tensor import DTensor
    from transformers import TrainerCallback

    from robust_pretrain.trainer import MinimaxTrainer

    class RecordSharding(TrainerCallback):
        """Writes how the prepared model is sharded (at the start of training) and how often the chunked loss ran."""

        def __init__(self, trainer: MinimaxTrainer) -> None:
            self.trainer, self.record = trainer, {}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            parameters = list(model.parameters())
            self.record = {
                "distributed_type": self.trainer.accelerator.distributed_type.value,
                "mixed_precision": self.trainer.accelerator.mixed_precision,
                "wrapped_model": type(model).__name__,
                "dtensor_parameters": all(isinstance(p, DTensor) for p in parameters),
                "parameters": sum(p.numel() for p in parameters),
                "local_parameters": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in parameters),
            }

        def on_train_end(self, args, state, control, **kwargs):
            lm_loss = self.trainer.lm_loss
            self.record["chunked_forward_passes"] = 0 if lm_loss is None else lm_loss.forward_passes
            folder = Path(os.environ["FSDP2_ON_CPU_RECORD"])
            folder.mkdir(parents=True, exist_ok=True)
            rank = self.trainer.args.process_index
            path = folder / f"fsdp2-rank{rank}-{len(list(folder.glob(f'fsdp2-rank{rank}-*.json')))}.json"
            path.write_text(json.dumps(self.record))

    build = MinimaxTrainer.__init__

    def forced_fsdp2_init(self, *args, **kwargs) -> None:
        build(self, *args, **kwargs)
        state = self.accelerator.state
        state.distributed_type = PartialState().distributed_type = DistributedType.FSDP  # both shared states
        state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
        if self.accelerator.mixed_precision != "no":
            state.fsdp_plugin.set_mixed_precision(self.accelerator.mixed_precision)
        self.is_fsdp_enabled = True
        self.add_callback(RecordSharding(self))

    MinimaxTrainer.__init__ = forced_fsdp2_init
