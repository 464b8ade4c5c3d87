"""TaskSpec: default tasks, custom specs from dicts and YAML, validation messages."""

from __future__ import annotations

import pytest

from robust_pretrain.data import DEFAULT_POS_TASKS, TaskSpec


def test_default_spec_is_the_papers_nine_tasks():
    spec = TaskSpec.resolve(None)
    assert spec.task_names == [
        "verb",
        "noun",
        "adjective",
        "determiner",
        "adverb",
        "pronoun",
        "preposition",
        "conjunction",
        "interjection",
    ]
    assert spec == TaskSpec.default() == TaskSpec(DEFAULT_POS_TASKS)
    mapping = spec.tag_to_task
    assert mapping["AUX"] == mapping["VERB"] == 0 and mapping["PROPN"] == 1 and mapping["SCONJ"] == 7
    assert not {"PUNCT", "NUM", "SYM", "PART", "X"} & set(mapping)


def test_custom_spec_from_dict_and_yaml(tmp_path):
    spec = TaskSpec.resolve({"content": ["noun", "VERB", "ADJ"], "function": "DET"})
    assert spec.task_names == ["content", "function"] and spec.num_tasks == 2
    assert spec.to_dict() == {"content": ["NOUN", "VERB", "ADJ"], "function": ["DET"]}
    path = tmp_path / "tasks.yaml"
    path.write_text("function: [DET, ADP]\ncontent: [NOUN]\n")
    assert TaskSpec.resolve(str(path)).task_names == ["function", "content"]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"noun": ["NOUN", "NOUNS"]}, "unknown UPOS tag 'NOUNS'"),
        ({"noun": ["NOUN"], "names": ["PROPN", "NOUN"]}, "'NOUN' is in two tasks: 'noun' and 'names'"),
        ({"noun": []}, "task 'noun' has no UPOS tags"),
        ({}, "non-empty mapping"),
        ({"": ["NOUN"]}, "non-empty strings"),
        ({"noun": [1]}, "must be a UPOS tag or a list"),
    ],
)
def test_invalid_specs_name_the_problem(groups, message):
    with pytest.raises(ValueError, match=message):
        TaskSpec(groups)


def test_bad_yaml_and_types(tmp_path):
    with pytest.raises(FileNotFoundError, match="task spec file not found"):
        TaskSpec.resolve(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- NOUN\n- VERB\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        TaskSpec.from_yaml(path)
    with pytest.raises(TypeError, match="expected a TaskSpec"):
        TaskSpec.resolve(3)
