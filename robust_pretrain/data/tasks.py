"""Task specification: named, ordered groups of UPOS tags, each group one upstream task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

#: the 17 Universal Dependencies part-of-speech tags
UPOS_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip

#: the paper's 9 part-of-speech tasks and the UPOS tags each groups
DEFAULT_POS_TASKS: Mapping[str, tuple[str, ...]] = {
    "verb": ("VERB", "AUX"),
    "noun": ("NOUN", "PROPN"),
    "adjective": ("ADJ",),
    "determiner": ("DET",),
    "adverb": ("ADV",),
    "pronoun": ("PRON",),
    "preposition": ("ADP",),
    "conjunction": ("CCONJ", "SCONJ"),
    "interjection": ("INTJ",),
}
"""The paper's nine PoS tasks in order. PUNCT, NUM, SYM, PART and X belong to no task: never masked, always context."""

EWT_UPOS_SHARES: Mapping[str, float] = {
    "ADJ": 0.0648, "ADP": 0.0866, "ADV": 0.0489, "AUX": 0.0613, "CCONJ": 0.0325, "DET": 0.0787, "INTJ": 0.0034,
    "NOUN": 0.1706, "NUM": 0.0202, "PART": 0.0268, "PRON": 0.0900, "PROPN": 0.0627, "PUNCT": 0.1207,
    "SCONJ": 0.0175, "SYM": 0.0045, "VERB": 0.1093, "X": 0.0016,
}  # fmt: skip
"""Share of each UPOS tag among the words of UD English-EWT train text (231,586 words) as the shipped tagger tags
it: what English text looks like to the English taggers."""
IMPLAUSIBLE_SHARE_FRACTION = 1 / 3
"""Text is not in the tagger's language when the share of its words that belong to a task is below this fraction of
the share English text has (:meth:`TaskSpec.expected_share`). Measured for the nine default tasks (expected 0.826)
with the shipped tagger: 0.69 to 0.83 on English (the 55 EWT test documents of at least 100 words, SST-2, CoLA,
MRPC and RTE dev), 0.0 on Chinese, Japanese, Arabic, Russian and emoji-only text: the limit (0.275) sits 2.5x below
the lowest English figure, and refuses text of which more than about two thirds are foreign words."""
JUDGED_MIN_EXPECTED_SHARE = 0.25
"""Specs whose tags hold less of English text than this are not judged by share (it varies too much with genre)."""

TaskSpecLike = Union["TaskSpec", Mapping[str, str | Sequence[str]], str, Path, None]


@dataclass(frozen=True)
class TaskSpec:
    """Ordered mapping ``task name -> UPOS tags``; a word is a target of the task whose group holds its tag.

    Tags in no group are never masked. Task ids are positions in :attr:`task_names`.
    """

    groups: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        if not isinstance(self.groups, Mapping) or not self.groups:
            raise ValueError("task spec must be a non-empty mapping of task name -> list of UPOS tags")
        normalized: dict[str, tuple[str, ...]] = {}
        owner: dict[str, str] = {}
        for name, tags in self.groups.items():
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"task names must be non-empty strings, got {name!r}")
            tag_list = [tags] if isinstance(tags, str) else tags
            if not isinstance(tag_list, Sequence) or not all(isinstance(t, str) for t in tag_list):
                raise ValueError(f"task {name!r}: tags must be a UPOS tag or a list of UPOS tags, got {tags!r}")
            if not tag_list:
                raise ValueError(f"task {name!r} has no UPOS tags (empty group)")
            group = []
            for tag in tag_list:
                upper = tag.strip().upper()
                if upper not in UPOS_TAGS:
                    raise ValueError(f"task {name!r}: unknown UPOS tag {tag!r}; valid tags: {', '.join(UPOS_TAGS)}")
                if upper in owner:
                    raise ValueError(f"UPOS tag {upper!r} is in two tasks: {owner[upper]!r} and {name!r}")
                owner[upper] = name
                group.append(upper)
            normalized[name] = tuple(group)
        object.__setattr__(self, "groups", normalized)

    @classmethod
    def default(cls) -> TaskSpec:
        """The paper's nine part-of-speech tasks (:data:`~robust_pretrain.data.tasks.DEFAULT_POS_TASKS`)."""
        return cls(DEFAULT_POS_TASKS)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TaskSpec:
        """Read a YAML file holding a mapping ``task name: [UPOS, ...]`` (order of keys = task order)."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"task spec file not found: {path}")
        with open(path, encoding="utf-8") as handle:
            groups = yaml.safe_load(handle)
        if not isinstance(groups, Mapping):
            raise ValueError(
                f"{path}: expected a mapping of task name -> list of UPOS tags, got {type(groups).__name__}"
            )
        return cls(groups)

    @classmethod
    def resolve(cls, spec: TaskSpecLike) -> TaskSpec:
        """Accept a ``TaskSpec``, a mapping, a YAML path, or ``None`` (the default spec)."""
        if spec is None:
            return cls.default()
        if isinstance(spec, TaskSpec):
            return spec
        if isinstance(spec, (str, Path)):
            return cls.from_yaml(spec)
        if isinstance(spec, Mapping):
            return cls(spec)
        raise TypeError(f"expected a TaskSpec, a mapping, a YAML path or None, got {type(spec).__name__}")

    @property
    def task_names(self) -> list[str]:
        """Task names in task-id order."""
        return list(self.groups)

    @property
    def num_tasks(self) -> int:
        return len(self.groups)

    @property
    def tag_to_task(self) -> dict[str, int]:
        """UPOS tag -> task id, for the tags that belong to a task."""
        return {tag: task_id for task_id, tags in enumerate(self.groups.values()) for tag in tags}

    def expected_share(self) -> float:
        """Share of the words of English text that belong to a task (``EWT_UPOS_SHARES`` of the spec's tags)."""
        return sum(EWT_UPOS_SHARES[tag] for tag in self.tag_to_task)

    def to_dict(self) -> dict[str, list[str]]:
        """Plain ``{task name: [tags]}`` (e.g. to store in a config)."""
        return {name: list(tags) for name, tags in self.groups.items()}
