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
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_TOKEN = "hf_local_test_token"
DEFAULT_USER = "local-user"
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"

_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def _git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.body = headers or {}, body or {}


@dataclass
class _Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    date: str
    files: dict[str, str]  # path -> blob oid


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    owner: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    commits: dict[str, _Commit] = field(default_factory=dict)

    def resolve(self, revision: str) -> _Commit:
        oid = self.branches.get(revision, revision)
        if oid not in self.commits:
            raise _HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]


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
        self._repos: dict[tuple[str, str], _Repo] = {}
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
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
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

    def _get_repo(self, repo_type: str, repo_id: str, user: str | None = None) -> _Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and user != repo.owner):
            raise _HttpError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        return repo

    def _history(self, repo: _Repo, revision: str) -> list[_Commit]:
        commit: _Commit | None = repo.resolve(revision)
        history = []
        while commit is not None:
            history.append(commit)
            commit = repo.commits[commit.parent] if commit.parent else None
        return history

    def _new_commit(
        self, repo: _Repo, branch: str, files: dict[str, str], title: str, message: str, author: str
    ) -> _Commit:
        parent = repo.branches.get(branch)
        seed = json.dumps([self._nonce, repo.repo_id, parent, len(repo.commits), title, sorted(files.items())])
        commit = _Commit(
            oid=hashlib.sha1(seed.encode()).hexdigest(),
            parent=parent,
            title=title,
            message=message,
            author=author,
            date=_now(),
            files=files,
        )
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _store_blob(self, content: bytes) -> str:
        oid = _git_blob_oid(content)
        self._blobs[oid] = content
        return oid

    def _url(self, repo: _Repo) -> str:
        return f"{self.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHubServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections are closed after this many seconds

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._connections.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request logging to stderr."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, method: str) -> None:
        hub = self.hub
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.segments = [unquote(s) for s in url.path.strip("/").split("/")] if url.path.strip("/") else []
        with hub._admission_lock:
            over_budget = hub._admitted >= hub.max_requests
            hub._admitted += not over_budget
        if over_budget:
            self.close_connection = True
            self._send_error(_HttpError(503, "LocalHubServer request budget exhausted; stopping"))
            self.wfile.flush()  # the refusal is on the wire before the connections are cut
            threading.Thread(target=hub.stop, daemon=True).start()
            return
        try:
            body = self._read_body()
            self._route(method, body)
        except _HttpError as err:
            self._send_error(err)
        except (ValueError, KeyError) as err:  # malformed JSON / NDJSON / base64 payloads
            self._send_error(_HttpError(400, f"Malformed request: {err!r}"))
        except Exception as err:  # report server bugs to the client instead of hanging it
            self._send_error(_HttpError(500, f"LocalHubServer internal error: {err!r}"))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            self.close_connection = True
            raise _HttpError(411, "chunked request bodies are not supported")
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.hub.max_body_bytes:
            self.close_connection = True
            raise _HttpError(413, f"request body larger than {self.hub.max_body_bytes} bytes")
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """Answer with ``body`` (omitted for HEAD; ``Content-Length`` may be overridden, e.g. for ranges)."""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.hub.requests.append((self.command, self.path, status))

    def _send_json(self, data: Any) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _send_error(self, err: _HttpError) -> None:
        message = err.message.encode("ascii", "replace").decode()  # header values must be latin-1
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._send(err.status, json.dumps({"error": err.message, **err.body}).encode(), headers)

    def _user(self) -> str | None:
        """User of the bearer token; an unknown token is refused with 401 even on public resources, like the Hub."""
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        token = auth.removeprefix("Bearer ").strip()
        if token not in self.hub.tokens:
            raise _HttpError(401, INVALID_CREDENTIALS)
        return self.hub.tokens[token]

    def _require_user(self) -> str:
        user = self._user()
        if user is None:
            raise _HttpError(401, "You must be authenticated to access this resource")
        return user

    def _writer(self, repo_type: str, repo_id: str) -> tuple[str, _Repo]:
        user = self._require_user()
        repo = self.hub._get_repo(repo_type, repo_id, user)
        if repo.owner != user:
            raise _HttpError(403, f"You don't have the rights to write to {repo_id}")
        return user, repo

    # ------------------------------------------------------------------ routing

    def _route(self, method: str, body: bytes) -> None:
        s = self.segments
        if s[:1] == ["api"]:
            if s == ["api", "whoami-v2"] and method == "GET":
                return self._whoami()
            if s == ["api", "repos", "create"] and method == "POST":
                return self._create_repo(json.loads(body or b"{}"))
            if s == ["api", "validate-yaml"] and method == "POST":
                return self._send_json({"errors": [], "warnings": []})
            if len(s) >= 4 and s[1] in _REPO_TYPES:
                return self._repo_api(method, _REPO_TYPES[s[1]], f"{s[2]}/{s[3]}", s[4:], body)
        elif method in ("GET", "HEAD"):
            repo_type, rest = (_REPO_TYPES[s[0]], s[1:]) if s[:1] and s[0] in _REPO_TYPES else ("model", s)
            if len(rest) >= 5 and rest[2] == "resolve":
                return self._resolve(method, repo_type, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        raise _HttpError(404, f"LocalHubServer does not implement {method} {self.path}")

    def _repo_api(self, method: str, repo_type: str, repo_id: str, rest: list[str], body: bytes) -> None:
        action = rest[0] if rest else ""
        if method == "GET" and not rest:
            return self._info(repo_type, repo_id, "main")
        if method == "GET" and action == "revision" and len(rest) == 2:
            return self._info(repo_type, repo_id, rest[1])
        if method == "GET" and action == "tree" and len(rest) >= 2:
            return self._tree(repo_type, repo_id, rest[1], "/".join(rest[2:]))
        if method == "GET" and action == "refs":
            return self._refs(repo_type, repo_id)
        if method == "GET" and action == "commits" and len(rest) == 2:
            return self._commits(repo_type, repo_id, rest[1])
        if method == "POST" and action == "preupload" and len(rest) == 2:
            return self._preupload(repo_type, repo_id, rest[1], json.loads(body))
        if method == "POST" and action == "commit" and len(rest) == 2:
            return self._commit(repo_type, repo_id, rest[1], body)
        if method == "POST" and action == "branch" and len(rest) == 2:
            return self._create_branch(repo_type, repo_id, rest[1], json.loads(body or b"{}"))
        raise _HttpError(404, f"LocalHubServer does not implement {method} {self.path}")

    # ------------------------------------------------------------------ endpoints

    def _whoami(self) -> None:
        user = self._require_user()
        self._send_json(
            {
                "type": "user",
                "id": hashlib.sha1(user.encode()).hexdigest()[:24],
                "name": user,
                "fullname": user,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "local-test", "role": "write"}},
            }
        )

    def _create_repo(self, payload: dict[str, Any]) -> None:
        user = self._require_user()
        namespace = payload.get("organization") or user
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIX:
            raise _HttpError(400, f"Unsupported repo type: {repo_type}")
        if namespace != user:
            raise _HttpError(403, f"You don't have the rights to create a {repo_type} under the namespace {namespace}")
        repo_id = f"{namespace}/{payload['name']}"
        hub = self.hub
        with hub._lock:
            if (repo_type, repo_id) in hub._repos:
                repo = hub._repos[(repo_type, repo_id)]
                raise _HttpError(409, f"You already created this {repo_type} repo", body={"url": hub._url(repo)})
            repo = _Repo(repo_type, repo_id, user, payload.get("visibility") == "private", _now())
            hub._repos[(repo_type, repo_id)] = repo
            files = {".gitattributes": hub._store_blob(_GITATTRIBUTES)}
            hub._new_commit(repo, "main", files, "initial commit", "", user)
            self._send_json({"url": hub._url(repo), "name": repo_id, "id": uuid.uuid4().hex[:24]})

    def _info(self, repo_type: str, repo_id: str, revision: str) -> None:
        hub = self.hub
        with hub._lock:
            repo = hub._get_repo(repo_type, repo_id, self._user())
            commit = repo.resolve(revision)
            with_blobs = self.query.get("blobs", ["false"])[0].lower() in ("1", "true")
            siblings = []
            for path, oid in sorted(commit.files.items()):
                sibling: dict[str, Any] = {"rfilename": path}
                if with_blobs:
                    sibling.update(size=len(hub._blobs[oid]), blobId=oid)
                siblings.append(sibling)
            self._send_json(
                {
                    "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                    "id": repo_id,
                    "author": repo.owner,
                    "sha": commit.oid,
                    "lastModified": commit.date,
                    "createdAt": repo.created_at,
                    "private": repo.private,
                    "gated": False,
                    "disabled": False,
                    "downloads": 0,
                    "likes": 0,
                    "tags": [],
                    "siblings": siblings,
                }
            )

    def _tree(self, repo_type: str, repo_id: str, revision: str, prefix: str) -> None:
        hub = self.hub
        with hub._lock:
            commit = hub._get_repo(repo_type, repo_id, self._user()).resolve(revision)
            recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
            base = f"{prefix}/" if prefix else ""
            entries: dict[str, dict[str, Any]] = {}
            for path, oid in sorted(commit.files.items()):
                if not path.startswith(base):
                    continue
                parts = path[len(base) :].split("/")
                for depth in range(1, len(parts)):  # folders on the way to the file
                    folder = base + "/".join(parts[:depth])
                    if recursive or depth == 1:
                        folder_oid = hashlib.sha1(f"{commit.oid}:{folder}".encode()).hexdigest()
                        entries.setdefault(folder, {"type": "directory", "oid": folder_oid, "size": 0, "path": folder})
                if recursive or len(parts) == 1:
                    entries[path] = {"type": "file", "oid": oid, "size": len(hub._blobs[oid]), "path": path}
            if prefix and not entries:
                raise _HttpError(404, f"{prefix} does not exist on {revision}", "EntryNotFound")
            self._send_json(list(entries.values()))

    def _refs(self, repo_type: str, repo_id: str) -> None:
        with self.hub._lock:
            repo = self.hub._get_repo(repo_type, repo_id, self._user())
            branches = [
                {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid} for name, oid in repo.branches.items()
            ]
            self._send_json({"branches": branches, "converts": [], "tags": [], "pullRequests": []})

    def _commits(self, repo_type: str, repo_id: str, revision: str) -> None:
        with self.hub._lock:
            history = self.hub._history(self.hub._get_repo(repo_type, repo_id, self._user()), revision)
            self._send_json(
                [
                    {
                        "id": c.oid,
                        "title": c.title,
                        "message": c.message,
                        "authors": [{"user": c.author}],
                        "date": c.date,
                    }
                    for c in history
                ]
            )

    def _create_branch(self, repo_type: str, repo_id: str, branch: str, payload: dict[str, Any]) -> None:
        with self.hub._lock:
            _, repo = self._writer(repo_type, repo_id)
            if branch in repo.branches:
                raise _HttpError(409, f"Reference refs/heads/{branch} already exists")
            repo.branches[branch] = repo.resolve(payload.get("startingPoint") or "main").oid
            self._send_json({})

    def _preupload(self, repo_type: str, repo_id: str, revision: str, payload: dict[str, Any]) -> None:
        if "create_pr" in self.query:
            raise _HttpError(400, "LocalHubServer does not support pull requests")
        with self.hub._lock:
            _, repo = self._writer(repo_type, repo_id)
            current = repo.resolve(revision).files
            files = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": current.get(f["path"])}
                for f in payload["files"]
            ]
            self._send_json({"files": files, "commitOid": repo.resolve(revision).oid})

    def _commit(self, repo_type: str, repo_id: str, branch: str, body: bytes) -> None:
        if "create_pr" in self.query:
            raise _HttpError(400, "LocalHubServer does not support pull requests")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _HttpError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        hub = self.hub
        with hub._lock:
            user, repo = self._writer(repo_type, repo_id)
            if branch not in repo.branches:
                raise _HttpError(
                    404, f"Invalid rev id: {branch} (commits are only accepted on branches)", "RevisionNotFound"
                )
            head = repo.branches[branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise _HttpError(412, f"A commit has happened since {parent}: {branch} is now at {head}")
            files = dict(repo.commits[head].files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    files[path] = hub._store_blob(base64.b64decode(value["content"]))
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise _HttpError(404, f"{path} does not exist on {branch}", "EntryNotFound")
                elif key == "deletedFolder":
                    folder = path.rstrip("/") + "/"
                    files = {p: oid for p, oid in files.items() if not p.startswith(folder)}
                elif key == "lfsFile":
                    raise _HttpError(400, f"{path}: LFS/Xet uploads are not supported (preupload answers 'regular')")
                else:
                    raise _HttpError(400, f"Unknown commit operation: {key}")
            commit = hub._new_commit(repo, branch, files, header["summary"], header.get("description", ""), user)
            self._send_json(
                {
                    "success": True,
                    "commitOid": commit.oid,
                    "commitUrl": f"{hub._url(repo)}/commit/{commit.oid}",
                    "pullRequestUrl": None,
                    "hookOutput": "",
                }
            )

    def _resolve(self, method: str, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        hub = self.hub
        with hub._lock:
            commit = hub._get_repo(repo_type, repo_id, self._user()).resolve(revision)
            if path not in commit.files:
                raise _HttpError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
            oid = commit.files[path]
            content = hub._blobs[oid]
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": commit.oid,
            "ETag": f'"{oid}"',
            "Accept-Ranges": "bytes",
        }
        status, start, end = 200, 0, len(content)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match and method == "GET":
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, len(content)) if match.group(2) else len(content)
            if start >= len(content) > 0 or start > end:
                raise _HttpError(
                    416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{len(content)}"}
                )
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(content)}"
        headers["Content-Length"] = str(end - start)
        self._send(status, content[start:end], headers)


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
