"""The local Hub's repositories, in memory: repos with their branches and commits (files as blob ids), and the
HTTP error a request ends with."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

#: the URL segment of a repo type -> the type
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
#: a repo type -> the prefix of its URLs
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
#: the ``.gitattributes`` of a new repo
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


def utc_now() -> str:
    """The time now as the Hub writes it (UTC, ISO 8601 with milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def git_blob_oid(content: bytes) -> str:
    """The git blob id of ``content`` (what the Hub reports as a file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HttpError(Exception):
    """Ends a request with an HTTP error: ``status``, the message (also in ``X-Error-Message``), the Hub's
    ``X-Error-Code``, extra headers and extra fields of the JSON body."""

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
class Commit:
    """A commit: its files as path -> blob id."""

    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    date: str
    files: dict[str, str]  # path -> blob oid


@dataclass
class Repo:
    """A repository: its branches (name -> commit id) and every commit."""

    repo_type: str
    repo_id: str
    owner: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    commits: dict[str, Commit] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        oid = self.branches.get(revision, revision)
        if oid not in self.commits:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]
