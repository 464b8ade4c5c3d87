"""The local Hub's HTTP request handler: each request is admitted (within the server's budget), routed to an
endpoint of the Hub API and answered in JSON, or with the Hub's error status and headers. It works on the state of
its ``LocalHubServer`` (``hub``), under the server's lock."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from local_hub.hub_repos import GITATTRIBUTES, REPO_TYPES, URL_PREFIX, HttpError, Repo, utc_now

if TYPE_CHECKING:
    from local_hub.hub_server import LocalHubServer

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


class HubRequestHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests for the server ``hub`` (a subclass per server binds it)."""

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
            self._send_error(HttpError(503, "LocalHubServer request budget exhausted; stopping"))
            self.wfile.flush()  # the refusal is on the wire before the connections are cut
            threading.Thread(target=hub.stop, daemon=True).start()
            return
        try:
            body = self._read_body()
            self._route(method, body)
        except HttpError as err:
            self._send_error(err)
        except (ValueError, KeyError) as err:  # malformed JSON / NDJSON / base64 payloads
            self._send_error(HttpError(400, f"Malformed request: {err!r}"))
        except Exception as err:  # report server bugs to the client instead of hanging it
            self._send_error(HttpError(500, f"LocalHubServer internal error: {err!r}"))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            self.close_connection = True
            raise HttpError(411, "chunked request bodies are not supported")
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.hub.max_body_bytes:
            self.close_connection = True
            raise HttpError(413, f"request body larger than {self.hub.max_body_bytes} bytes")
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

    def _send_error(self, err: HttpError) -> None:
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
            raise HttpError(401, INVALID_CREDENTIALS)
        return self.hub.tokens[token]

    def _require_user(self) -> str:
        user = self._user()
        if user is None:
            raise HttpError(401, "You must be authenticated to access this resource")
        return user

    def _writer(self, repo_type: str, repo_id: str) -> tuple[str, Repo]:
        user = self._require_user()
        repo = self.hub._get_repo(repo_type, repo_id, user)
        if repo.owner != user:
            raise HttpError(403, f"You don't have the rights to write to {repo_id}")
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
            if len(s) >= 4 and s[1] in REPO_TYPES:
                return self._repo_api(method, REPO_TYPES[s[1]], f"{s[2]}/{s[3]}", s[4:], body)
        elif method in ("GET", "HEAD"):
            repo_type, rest = (REPO_TYPES[s[0]], s[1:]) if s[:1] and s[0] in REPO_TYPES else ("model", s)
            if len(rest) >= 5 and rest[2] == "resolve":
                return self._resolve(method, repo_type, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        raise HttpError(404, f"LocalHubServer does not implement {method} {self.path}")

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
        raise HttpError(404, f"LocalHubServer does not implement {method} {self.path}")

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
        if repo_type not in URL_PREFIX:
            raise HttpError(400, f"Unsupported repo type: {repo_type}")
        if namespace != user:
            raise HttpError(403, f"You don't have the rights to create a {repo_type} under the namespace {namespace}")
        repo_id = f"{namespace}/{payload['name']}"
        hub = self.hub
        with hub._lock:
            if (repo_type, repo_id) in hub._repos:
                repo = hub._repos[(repo_type, repo_id)]
                raise HttpError(409, f"You already created this {repo_type} repo", body={"url": hub._url(repo)})
            repo = Repo(repo_type, repo_id, user, payload.get("visibility") == "private", utc_now())
            hub._repos[(repo_type, repo_id)] = repo
            files = {".gitattributes": hub._store_blob(GITATTRIBUTES)}
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
                raise HttpError(404, f"{prefix} does not exist on {revision}", "EntryNotFound")
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
                raise HttpError(409, f"Reference refs/heads/{branch} already exists")
            repo.branches[branch] = repo.resolve(payload.get("startingPoint") or "main").oid
            self._send_json({})

    def _preupload(self, repo_type: str, repo_id: str, revision: str, payload: dict[str, Any]) -> None:
        if "create_pr" in self.query:
            raise HttpError(400, "LocalHubServer does not support pull requests")
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
            raise HttpError(400, "LocalHubServer does not support pull requests")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        hub = self.hub
        with hub._lock:
            user, repo = self._writer(repo_type, repo_id)
            if branch not in repo.branches:
                raise HttpError(
                    404, f"Invalid rev id: {branch} (commits are only accepted on branches)", "RevisionNotFound"
                )
            head = repo.branches[branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HttpError(412, f"A commit has happened since {parent}: {branch} is now at {head}")
            files = dict(repo.commits[head].files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    files[path] = hub._store_blob(base64.b64decode(value["content"]))
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HttpError(404, f"{path} does not exist on {branch}", "EntryNotFound")
                elif key == "deletedFolder":
                    folder = path.rstrip("/") + "/"
                    files = {p: oid for p, oid in files.items() if not p.startswith(folder)}
                elif key == "lfsFile":
                    raise HttpError(400, f"{path}: LFS/Xet uploads are not supported (preupload answers 'regular')")
                else:
                    raise HttpError(400, f"Unknown commit operation: {key}")
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
                raise HttpError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
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
                raise HttpError(
                    416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{len(content)}"}
                )
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(content)}"
        headers["Content-Length"] = str(end - start)
        self._send(status, content[start:end], headers)
