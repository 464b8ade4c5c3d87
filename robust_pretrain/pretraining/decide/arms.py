"""The arms of ``robust-pretrain-decide``: their names, the weights files of the static arms (checked before the
protocol is written), and what each cell trains.

Static arms draw each sequence's domain from a weights file written into the cell from the seed's ``natural`` run
(its provenance, its domains' training sequences and step budget):

* ``sampling_control``: the natural shares ``p``; ``stratified``: uniform;
* ``temperature``: ``q ∝ p^(1/τ)`` (``--temperature``; τ = 1 is natural, τ → ∞ uniform);
* ``unimax`` (Chung et al. 2023): the budget of ``B`` drawn sequences spread uniformly, a domain whose ``N_t``
  sequences would be repeated more than ``--epoch_cap`` epochs capped at ``cap * N_t`` draws and the rest
  redistributed over the others (:func:`unimax_weights`);
* ``--arm NAME=weights.json``: the file's ``{"weights": {domain: weight}}``; one without ``provenance`` (written by
  hand) gets the natural run's, one with provenance is checked against the run's by the recipe.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.causal_lm.arguments import load_domain_weights

BUILT_IN_ARMS = (
    "natural", "sampling_control", "stratified", "unimax", "temperature", "minimax", "minimax_capped", "group_dro",
    "doremi",
)  # fmt: skip
#: a custom arm's name: a folder name under cells/ (no separator, no leading dot)
ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
#: the weights file a static arm's cell draws from
ARM_WEIGHTS_NAME = "arm_weights.json"


def custom_arms(entries: list[str] | None) -> dict[str, Path]:
    """``--arm NAME=weights.json`` entries -> their files; a bad name, a repeated or built-in name, or a missing file
    is refused."""
    arms: dict[str, Path] = {}
    for entry in entries or []:
        name, _, path = entry.partition("=")
        if not name or not path:
            raise UsageError(f"--arm {entry}: expected NAME=weights.json")
        if not ARM_NAME.fullmatch(name):
            raise UsageError(f"--arm {entry}: an arm name is letters, digits, '_' and '-' (it names a folder)")
        if name in BUILT_IN_ARMS or name in arms:
            raise UsageError(f"--arm {entry}: the arm {name!r} is given already; choose another name")
        if not Path(path).is_file():
            raise UsageError(f"--arm {entry}: {path} is not a file")
        arms[name] = Path(path).resolve()
    return arms


def read_arm_file(name: str, path: Path, domains: list[str]) -> dict[str, Any]:
    """The content of arm ``name``'s weights file (its ``weights``, and its ``provenance`` when it has one), read and
    checked by :func:`~robust_pretrain.pretraining.causal_lm.arguments.load_domain_weights` against the data's
    ``domains``; refused otherwise, naming the file."""
    weights, provenance = load_domain_weights(path, f"--arm {name}={path}", domains)
    return {"weights": weights} if provenance is None else {"weights": weights, "provenance": provenance}


def unimax_weights(sequences: dict[str, int], budget: float, cap: float) -> dict[str, float]:
    """UniMax's sampling weights: ``budget`` draws spread uniformly over the domains, smallest first, each domain
    getting at most ``cap * N_t`` (its share of what is left otherwise); normalised. When every domain is capped the
    weights are ``∝ N_t`` (the budget then repeats every domain more than ``cap`` epochs)."""
    left, draws = float(budget), {}
    order = sorted(sequences, key=sequences.__getitem__)
    for index, domain in enumerate(order):
        draws[domain] = min(left / (len(order) - index), cap * sequences[domain])
        left -= draws[domain]
    total = sum(draws.values())
    return {domain: draws[domain] / total for domain in sequences}


def temperature_weights(shares: dict[str, float], temperature: float) -> dict[str, float]:
    """``q ∝ p^(1/τ)`` of the natural shares ``p``."""
    powered = {domain: share ** (1 / temperature) for domain, share in shares.items()}
    total = sum(powered.values())
    return {domain: value / total for domain, value in powered.items()}


def weights_content(weights: dict[str, float], natural: dict[str, Any]) -> dict[str, Any]:
    """A domain-weights file (normalised) with the provenance of the seed's natural run (same tokenizer, data, size)."""
    total = sum(weights.values())
    return {"weights": {name: value / total for name, value in weights.items()}, "provenance": natural["provenance"]}


def budget(report: dict[str, Any]) -> float:
    """Sequences a run draws: its steps times its global batch."""
    return report["settings"]["max_steps"] * report["global_batch_sequences"]


def static_weights(arm: str, natural: dict[str, Any], settings: dict[str, Any], files: dict[str, Any]) -> dict:
    """The weights file of a static arm for the seed whose natural run reported ``natural``."""
    domains = natural["tasks"]
    if arm == "sampling_control":
        return weights_content(natural["mixture_weights"], natural)
    if arm == "stratified":
        return weights_content(dict.fromkeys(domains, 1.0), natural)
    if arm == "temperature":
        return weights_content(temperature_weights(natural["mixture_weights"], settings["temperature"]), natural)
    if arm == "unimax":
        weights = unimax_weights(natural["training_sequences"], budget(natural), settings["epoch_cap"])
        return weights_content(weights, natural)
    content = files[arm]
    return content if "provenance" in content else weights_content(content["weights"], natural)


def cell_plan(
    arm: str, cell: Path, natural: dict[str, Any], settings: dict[str, Any], files: dict[str, Any]
) -> tuple[str, list[str], dict[Path, dict[str, Any]]]:
    """The recipe, the arm's own options and the files to write before it runs, of one (non-natural) cell;
    ``settings``: the protocol (``epoch_cap``, ``temperature``); ``files``: the custom arms' file contents."""
    if arm == "doremi":
        return "mixture", [], {}
    online = ["--task_sampling", "online"]
    if arm == "minimax":
        return "causal_lm", ["--weighting", "minimax", *online], {}
    if arm == "minimax_capped":
        return (
            "causal_lm",
            ["--weighting", "minimax", *online, "--max_epochs_per_task", repr(settings["epoch_cap"])],
            {},
        )
    if arm == "group_dro":
        losses = [repr(natural["eval_task_loss"][name]) for name in natural["tasks"]]
        return (
            "causal_lm",
            ["--weighting", "group_dro", "--loss_normalization", "excess", "--reference_losses", *losses, *online],
            {},
        )
    path = cell / ARM_WEIGHTS_NAME
    content = static_weights(arm, natural, settings, files)
    return "causal_lm", ["--weighting", "proportional", "--domain_weights", str(path)], {path: content}


__all__ = [
    "ARM_WEIGHTS_NAME",
    "BUILT_IN_ARMS",
    "cell_plan",
    "custom_arms",
    "read_arm_file",
    "temperature_weights",
    "unimax_weights",
]
