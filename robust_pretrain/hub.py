"""Publish a finished training output directory to the Hugging Face Hub, with actionable errors.

The local save always comes first; publishing is a separate, retryable step:

* :func:`publish_output_dir` uploads an existing ``output_dir`` (model or PEFT adapter, tokenizer, model card, task
  report and plots) and is exposed as the ``robust-pretrain-publish`` command (:func:`main`).
* :func:`push_or_explain` runs any push (e.g. ``trainer.push_to_hub``) and turns "Hub unreachable" and "token
  refused" failures into a :class:`HubPublishError` telling that the local files are safe and how to retry.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx2
from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi, constants
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects, validate_repo_id

from robust_pretrain.cli import ConsoleArgumentParser, UsageError, run_console
from robust_pretrain.reporting.cards import card_text_for_repo

T = TypeVar("T")

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# Resumable-training state: left out of a published model unless ``include_checkpoints=True``.
TRAINING_STATE_PATTERNS = ("checkpoint-*", "global_step*", "optimizer.*", "scheduler.*", "scaler.*", "rng_state*")
DEFAULT_COMMIT_MESSAGE = "Upload model trained with robust-pretrain"


class InvalidOutputDirError(ValueError):
    """The directory to publish does not exist or does not contain a saved model or adapter."""


class HubPublishError(RuntimeError):
    """Publishing failed because the Hub was unreachable or refused the token; the local files are untouched.

    Attributes:
        reason: ``"unreachable"`` or ``"auth"``.
        output_dir: the local directory that holds the saved model.
        repo_id: the target repository, if known.
    """

    def __init__(self, message: str, *, reason: Literal["unreachable", "auth"], output_dir: Path, repo_id: str | None):
        super().__init__(message)
        self.reason = reason
        self.output_dir = output_dir
        self.repo_id = repo_id


def validate_output_dir(output_dir: str | Path) -> Path:
    """Return ``output_dir`` as a resolved path if it holds ``config.json`` + weights or a PEFT adapter.

    Raises:
        InvalidOutputDirError: with the reason and what was found instead.
    """
    path = Path(output_dir).expanduser().resolve()
    if not path.exists():
        raise InvalidOutputDirError(f"Output directory '{path}' does not exist.")
    if not path.is_dir():
        raise InvalidOutputDirError(f"'{path}' is not a directory.")
    names = {p.name for p in path.iterdir() if p.is_file()}
    if "config.json" in names and names.intersection(WEIGHT_FILES):
        return path
    if "adapter_config.json" in names and names.intersection(ADAPTER_WEIGHT_FILES):
        return path
    found = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())) or "nothing"
    raise InvalidOutputDirError(
        f"'{path}' does not contain a saved model: expected config.json plus weights ({', '.join(WEIGHT_FILES)}), "
        f"or a PEFT adapter (adapter_config.json plus {' or '.join(ADAPTER_WEIGHT_FILES)}). Found: {found}. "
        "Save the model with trainer.save_model(output_dir) first."
    )


def publish_command(
    output_dir: str | Path,
    repo_id: str | None,
    *,
    private: bool = False,
    revision: str | None = None,
    include_checkpoints: bool = False,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
) -> str:
    """The ``robust-pretrain-publish`` command line that publishes ``output_dir`` with these options (never a token)."""
    args = ["robust-pretrain-publish", str(output_dir), "--repo-id", repo_id or "<namespace>/<name>"]
    if private:
        args.append("--private")
    if revision is not None:
        args += ["--revision", revision]
    if include_checkpoints:
        args.append("--include-checkpoints")
    if commit_message != DEFAULT_COMMIT_MESSAGE:
        args += ["--commit-message", commit_message]
    return " ".join(shlex.quote(a) for a in args)


def _local_state(output_dir: Path) -> str:
    try:
        validate_output_dir(output_dir)
    except InvalidOutputDirError:
        return f"Nothing was uploaded; the local directory {output_dir} is unchanged."
    return f"Nothing is lost: the local save in {output_dir} is complete."


@contextmanager
def explain_hub_errors(output_dir: str | Path, repo_id: str | None = None, **publish_options: Any) -> Iterator[None]:
    """Re-raise connection and authentication failures of the Hub client as :class:`HubPublishError`, whose retry
    command repeats ``publish_options`` (those of :func:`publish_command`: private, revision, include_checkpoints,
    commit_message).

    Other errors (e.g. a missing repo or a server error) propagate unchanged.
    """
    directory = Path(output_dir).expanduser().resolve()
    retry = publish_command(directory, repo_id, **publish_options)
    try:
        yield
    except (httpx2.TransportError, ConnectionError) as err:
        offline = " (offline mode is on: unset HF_HUB_OFFLINE)" if isinstance(err, OfflineModeIsEnabled) else ""
        raise HubPublishError(
            f"Could not reach the Hugging Face Hub at {constants.ENDPOINT}{offline}: {err}\n"
            f"{_local_state(directory)}\n"
            f"Once the Hub is reachable, publish it with:\n    {retry}",
            reason="unreachable",
            output_dir=directory,
            repo_id=repo_id,
        ) from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status not in (401, 403):
            raise
        raise HubPublishError(
            f"The Hugging Face Hub at {constants.ENDPOINT} refused the token (HTTP {status}) for "
            f"{repo_id or 'the repository'}: the token is missing, invalid, or lacks write access to that namespace.\n"
            f"{_local_state(directory)}\n"
            "Create a token with write access (https://huggingface.co/settings/tokens), then publish with:\n"
            f"    {retry} --token <TOKEN>   (or set HF_TOKEN / run `hf auth login`)",
            reason="auth",
            output_dir=directory,
            repo_id=repo_id,
        ) from err


def push_or_explain(
    fn: Callable[[], T], *, output_dir: str | Path, repo_id: str | None = None, **publish_options: Any
) -> T:
    """Call ``fn`` (e.g. ``trainer.push_to_hub``) and return its result, raising :class:`HubPublishError` with a
    retry command (repeating ``publish_options``, see :func:`publish_command`) if the Hub is unreachable or refuses
    the token."""
    with explain_hub_errors(output_dir, repo_id, **publish_options):
        return fn()


def publish_output_dir(
    output_dir: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    revision: str | None = None,
    include_checkpoints: bool = False,
) -> CommitInfo:
    """Upload a saved training output directory to the Hub model repo ``repo_id`` (created if missing).

    Everything in ``output_dir`` is uploaded (weights or adapter, config, tokenizer, README.md model card,
    task_report.json, task_weights.png, ...) except ``checkpoint-*/`` folders and optimizer / scheduler / scaler /
    RNG states, unless ``include_checkpoints=True``. ``revision`` names a branch, created from ``main`` if needed.
    A model card written by :func:`robust_pretrain.reporting.cards.render_model_card` is published re-rendered for the
    repo (its code example loads the repo id); the local files are not changed.

    Raises:
        InvalidOutputDirError: ``output_dir`` is missing or holds no saved model (checked before any network call).
        HubPublishError: the Hub is unreachable or refused the token.
    """
    directory = validate_output_dir(output_dir)
    options = {"private": private, "revision": revision, "include_checkpoints": include_checkpoints}
    with explain_hub_errors(directory, repo_id, commit_message=commit_message, **options):
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision is not None and revision != constants.DEFAULT_REVISION:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        ignored = [*DEFAULT_IGNORE_PATTERNS, *([] if include_checkpoints else TRAINING_STATE_PATTERNS)]
        files = [path.relative_to(directory).as_posix() for path in sorted(directory.rglob("*")) if path.is_file()]
        card = card_text_for_repo(directory, repo_id)
        operations = [
            CommitOperationAdd(
                path_in_repo=name,
                path_or_fileobj=card.encode() if name == "README.md" and card is not None else directory / name,
            )
            for name in filter_repo_objects(files, ignore_patterns=ignored)
        ]
        return api.create_commit(repo_id, operations, commit_message=commit_message, revision=revision)


def _build_parser() -> argparse.ArgumentParser:
    parser = ConsoleArgumentParser(
        prog="robust-pretrain-publish",
        description=(
            "Publish a robust-pretrain training output directory (model or PEFT adapter, tokenizer, model card, "
            "task report and plots) to a Hugging Face Hub model repository, creating it if needed. "
            "Checkpoint folders and optimizer/scheduler/RNG states are left out unless --include-checkpoints."
        ),
        epilog="The Hub endpoint is taken from HF_ENDPOINT (default https://huggingface.co).",
    )
    parser.add_argument("output_dir", type=Path, help="directory written by trainer.save_model() / the recipe")
    parser.add_argument("--repo-id", required=True, help="target repository, e.g. my-user/robust-bert")
    parser.add_argument("--token", help="Hub token with write access (default: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--private", action="store_true", help="create the repository as private if it is new")
    parser.add_argument("--revision", help="branch to publish to, created from main if missing (default: main)")
    parser.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE, help="commit message")
    parser.add_argument(
        "--include-checkpoints",
        action="store_true",
        help="also upload checkpoint-*/ folders and optimizer/scheduler/RNG states",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``robust-pretrain-publish``; returns the process exit code: 0 on success, 2 for a bad option or
    folder (one line, before any network access), 1 when the Hub cannot be reached or refuses the token."""
    try:
        return run_console(_publish, argv, prog="robust-pretrain-publish")
    except HubPublishError as err:
        print(f"robust-pretrain-publish: error: {err}", file=sys.stderr)
        return 1


def _publish(argv: list[str]) -> None:
    args = _build_parser().parse_args(argv)
    try:
        validate_repo_id(args.repo_id)
        validate_output_dir(args.output_dir)
    except (HFValidationError, InvalidOutputDirError) as err:
        raise UsageError(f"{'--repo-id' if isinstance(err, HFValidationError) else 'output_dir'}: {err}") from err
    commit = publish_output_dir(
        args.output_dir,
        args.repo_id,
        token=args.token,
        private=args.private,
        commit_message=args.commit_message,
        revision=args.revision,
        include_checkpoints=args.include_checkpoints,
    )
    print(f"Published {args.output_dir} to {commit.repo_url} ({commit.commit_url})")


if __name__ == "__main__":
    raise SystemExit(main())
