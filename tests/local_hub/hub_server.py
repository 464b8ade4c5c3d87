"""A small, in-memory, Hub-compatible HTTP server for tests.

It implements the subset of the Hugging Face Hub HTTP API that the real ``huggingface_hub`` client (2.x) and
``transformers`` use to create repos, commit files, list them and download them back:

* ``GET  /api/whoami-v2``
* ``POST /api/repos/create``, ``POST /api/validate-yaml``
* ``GET  /api/{type}s/{repo_id}[/revision/{rev}]`` (repo info with ``siblings``)
* ``POST /api/{type}s/{repo_id}/preupload/{rev}`` (always answers ``uploadMode: "regular"``, so the client sends file
  contents base64-encoded inside the commit: no LFS, no Xet)
* ``POST /api/{type}s/{repo_id}/commit/{rev}`` (NDJSON payload)
* ``GET  /api/{type}s/{repo_id}/tree/{rev}[/{path}]``, ``/refs``, ``/commits/{rev}``; ``POST .../branch/{name}``
* ``HEAD|GET /[{type}s/]{repo_id}/resolve/{rev}/{path}`` (with ``X-Repo-Commit``, ``ETag``, ``Content-Length``, ranges)

The server listens on 127.0.0.1 only, and stops by itself after ``lifetime`` seconds or ``max_requests`` requests.
Its state is in ``hub_repos``, its endpoints in ``hub_handler``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from local_hub.hub_handler import INVALID_CREDENTIALS, HubRequestHandler
from local_hub.hub_repos import URL_PREFIX, Commit, HttpError, Repo, git_blob_oid, utc_now

DEFAULT_TOKEN = "hf_local_test_token"
DEFAULT_USER = "local-user"

__all__ = ["DEFAULT_TOKEN", "DEFAULT_USER", "INVALID_CREDENTIALS", "LocalHubServer", "use_local_hub"]


class LocalHubServer:
    """In-memory Hub-compatible server on ``127.0.0.1`` (free port), for the real ``huggingface_hub`` client.

    Args:
        tokens: valid bearer tokens mapped to user names (default ``{DEFAULT_TOKEN: DEFAULT_USER}``). A user may
            write to repos in its own namespace only; an unknown token gets ``401`` like on the Hub.
        lifetime: seconds after which the server stops by itself.
        max_requests: the server answers ``503`` and stops after this many requests.
        max_body_bytes: larger request bodies are refused with ``413``.

    Use as a context manager (``with LocalHubServer() as hub: ...``) or call :meth:`start` / :meth:`stop`.
    Point the client at it with :func:`use_local_hub`.
    """

    def __init__(
        self,
        tokens: Mapping[str, str] | None = None,
        *,
        lifetime: float = 600.0,
        max_requests: int = 5000,
        max_body_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.tokens = dict(tokens) if tokens is not None else {DEFAULT_TOKEN: DEFAULT_USER}
        self.lifetime = lifetime
        self.max_requests = max_requests
        self.max_body_bytes = max_body_bytes
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) of every answered request
        self._repos: dict[tuple[str, str], Repo] = {}
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._admitted = 0  # requests let through, counted on arrival (answers are recorded after they are sent)
        self._admission_lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._timer: threading.Timer | None = None
        self._nonce = uuid.uuid4().hex
        self._connections: set[socket.socket] = set()

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        """Base URL to use as ``HF_ENDPOINT``, e.g. ``http://127.0.0.1:54321``."""
        if self._httpd is None:
            raise RuntimeError("LocalHubServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def request_count(self) -> int:
        return len(self.requests)

    def start(self) -> LocalHubServer:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("LocalHubServer is already started")
        handler = type("_BoundHandler", (HubRequestHandler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="local-hub-server", daemon=True).start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port (idempotent, callable from any thread)."""
        with self._lock:
            httpd, self._httpd = self._httpd, None
        if self._timer is not None:
            self._timer.cancel()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:  # also end kept-alive connections, so that nothing is answered any more
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> LocalHubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection helpers for tests

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Contents of every file of ``repo_id`` at ``revision``."""
        with self._lock:
            commit = self._repos[(repo_type, repo_id)].resolve(revision)
            return {path: self._blobs[oid] for path, oid in commit.files.items()}

    def commit_titles(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        """Commit titles of ``revision``, oldest first (the first one is the repo creation commit)."""
        with self._lock:
            return [c.title for c in reversed(self._history(self._repos[(repo_type, repo_id)], revision))]

    # ------------------------------------------------------------------ state (callers hold self._lock)

    def _get_repo(self, repo_type: str, repo_id: str, user: str | None = None) -> Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and user != repo.owner):
            raise HttpError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        return repo

    def _history(self, repo: Repo, revision: str) -> list[Commit]:
        commit: Commit | None = repo.resolve(revision)
        history = []
        while commit is not None:
            history.append(commit)
            commit = repo.commits[commit.parent] if commit.parent else None
        return history

    def _new_commit(
        self, repo: Repo, branch: str, files: dict[str, str], title: str, message: str, author: str
    ) -> Commit:
        parent = repo.branches.get(branch)
        seed = json.dumps([self._nonce, repo.repo_id, parent, len(repo.commits), title, sorted(files.items())])
        commit = Commit(
            oid=hashlib.sha1(seed.encode()).hexdigest(),
            parent=parent,
            title=title,
            message=message,
            author=author,
            date=utc_now(),
            files=files,
        )
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _store_blob(self, content: bytes) -> str:
        oid = git_blob_oid(content)
        self._blobs[oid] = content
        return oid

    def _url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"


@contextmanager
def use_local_hub(endpoint: str, *, token: str | None = None) -> Iterator[None]:
    """Point the in-process ``huggingface_hub`` / ``transformers`` clients at ``endpoint``, online; undo on exit.

    ``huggingface_hub`` reads ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` once, at import, and ``transformers`` keeps a
    shared ``HfApi`` bound to the endpoint of its creation time, so setting environment variables is not enough
    in-process: this patches those cached values, and also sets the environment variables for subprocesses.
    ``HF_TOKEN`` is set to ``token``, or unset if ``None``, so that a real token is never sent to a test server.
    """
    from huggingface_hub import constants, hf_api
    from transformers.utils import hub as transformers_hub

    endpoint = endpoint.rstrip("/")
    patches: list[tuple[Any, str, Any]] = [
        (constants, "ENDPOINT", endpoint),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"),
        (constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {urlsplit(endpoint).hostname or ""}),
        (constants, "HF_HUB_OFFLINE", False),
        (hf_api.api, "endpoint", endpoint),  # bound methods exported as `huggingface_hub.create_repo` etc.
        (transformers_hub, "_hf_api", None),  # recreated lazily with the patched endpoint
    ]
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_TOKEN": token,
        "HUGGING_FACE_HUB_TOKEN": None,
    }
    saved_attrs = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    saved_env = {key: os.environ.get(key) for key in env}
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        _set_env(env)
        yield
    finally:
        for obj, name, value in saved_attrs:
            setattr(obj, name, value)
        _set_env(saved_env)


def _set_env(values: Mapping[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
