"""``MinimaxTrainer``: the Hugging Face ``Trainer`` with a task-weighted (worst-case) objective.

Per optimizer step, for tasks t = 1..T with per-task target sums ``S_t`` and global target counts ``N_t`` (over every
micro-batch of the step and every process):

* the weights ``w`` are computed once, at the step's first micro-batch, from that micro-batch's per-task mean losses
  pooled over all processes (with ``gradient_accumulation_steps=1``: the paper's current-batch rule); a task absent
  from that micro-batch but present later in the step uses its last estimate;
* each micro-batch contributes ``sum_t w_t * S_t / N_t``, so the accumulated gradient equals the gradient of
  ``sum_t w_t * mean_t`` over the union of the step's batches, whatever the number of processes or micro-batches.

Only ``get_batch_samples`` (global per-task counts), ``compute_loss``, ``evaluation_loop`` (per-task eval losses,
full-size logits when predictions are collected), ``log``, ``create_optimizer`` (learnable weights), ``save_model`` and
``train`` (weighting state in checkpoints) are overridden; ``training_step`` is the Trainer's own, told through
``loss_is_scaled_for_ga`` (transformers >= 5.19) not to divide by the accumulation steps again.

A model returning ``task_losses`` (and ``task_counts``) instead: its per-task counts are known only after each forward
pass, so the step cannot be pooled exactly before the first backward; each micro-batch contributes
``sum_t w_t * mean_t / GA`` (means pooled exactly over processes), and a task present in k of the GA micro-batches has
the effective weight ``k / GA * w_t`` on the mean of its micro-batch means: that effective weight is what
``step_weights``, the ``task_weight/*`` logs and checkpoints report (``w_t`` itself with ``GA = 1``). A task whose count
is 0 is absent (its loss, the mean of nothing, may be NaN).

With ``reference_model`` (DoReMi's online excess loss, :mod:`robust_pretrain.reference`) a frozen reference model
runs without gradient on each step's first micro-batch; its per-task loss sums on the same targets travel in that
micro-batch's all-reduce, and their pooled means reach the weighting as the step's ``reference_losses``.

The tasks come from the data: ``task_names`` of the arguments, else of the data collator, else of the model; lists
that disagree are refused at construction. ``task_sampling`` (``online``, ``fixed``) draws each training sequence's
task: the trainer builds the schedule of sampling weights, hands it to the data collator (``sample_tasks``) and logs
the sampling weights (:mod:`robust_pretrain.trainer.task_sampling`).

Resuming checks that the weighting is built with the options saved in the checkpoint (``ValueError`` naming those
that differ). In a distributed run the default process group is destroyed at interpreter exit (gloo's worker threads
otherwise abort the finished process: ``terminate called without an active exception``).

A causal LM (see :func:`is_causal_lm`) is trained on next-token targets, shifted exactly as its own loss shifts them
(``labels`` padded with -100 and shifted left, or the batch's ``shift_labels``); token-level ``task_ids`` are shifted
with the labels, so each target counts for the task of the predicted token. Its eval metrics add per-task perplexities.
Its losses come from the final hidden states, in slices of the vocabulary no larger than ``causal_lm_chunk_size``
targets' logits (unset: from the shapes), without the full logits (:mod:`robust_pretrain.trainer.next_token_loss`). The
training collator finds each batch's targets on the host (:class:`~robust_pretrain.task_losses.HostTargets`).

Trainer options: ``label_smoothing_factor`` smooths every task's cross-entropy (class labels); ``compute_loss_func``
is refused (return ``task_losses`` from the model instead). In distributed evaluation the repeats the sampler adds to
complete the last batch are left out of the per-task eval losses, which therefore equal the 1-process values.

The parts: :mod:`~robust_pretrain.trainer.minimax` (the class: construction, data hooks, ``compute_loss``, optimizer)
and its mixins :mod:`~robust_pretrain.trainer.objective` (per-task sums, the weighted objective),
:mod:`~robust_pretrain.trainer.task_logs` (``evaluation_loop``, ``log``: per-task metrics and ``task_metrics.jsonl``)
and :mod:`~robust_pretrain.trainer.checkpoints` (``save_model``, ``train``: ``weighting_state.json``); beside them
:mod:`~robust_pretrain.trainer.callbacks`, :mod:`~robust_pretrain.trainer.models` (what is read off a model) and
:mod:`~robust_pretrain.trainer.process_group` (the teardown at exit). Every public name is importable from here.
"""

from .callbacks import LearnableWeightsCallback, LogLastStepCallback
from .checkpoints import WEIGHTING_STATE_NAME
from .minimax import TASK_COLUMNS, MinimaxTrainer
from .models import is_causal_lm, last_encoder_layer
from .objective import batch_size, first_rows
from .process_group import WORKER_DRAIN_SECONDS, register_process_group_teardown
from .task_logs import perplexity

__all__ = [
    "TASK_COLUMNS",
    "WEIGHTING_STATE_NAME",
    "WORKER_DRAIN_SECONDS",
    "LearnableWeightsCallback",
    "LogLastStepCallback",
    "MinimaxTrainer",
    "batch_size",
    "first_rows",
    "is_causal_lm",
    "last_encoder_layer",
    "perplexity",
    "register_process_group_teardown",
]
