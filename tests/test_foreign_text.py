"""Text the English taggers cannot tag (issue 17): other scripts are refused before training with the figures, mixed
English/other text trains on its English words only, and one huge line is tagged in bounded pieces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from processes import checkout_env

from robust_pretrain.data import get_tagger, load_ewt_corpus, tokenize_and_tag
from robust_pretrain.data.preprocessing import task_word_counts
from robust_pretrain.data.word_tokenizer import text_pieces, word_spans
from robust_pretrain.pretraining.pos_mlm import recipe
from robust_pretrain.pretraining.pos_mlm.model import train_wordpiece_tokenizer

FOREIGN_TEXTS = {  # real sentences, several per language
    "chinese": ["北京是中华人民共和国的首都，也是全国的政治和文化中心。", "他每天早上七点起床，然后去学校上课。",
                "这本书非常有意思，我已经读了三遍了！", "我们今天去公园散步了。"],
    "arabic": ["ذهبنا إلى الحديقة اليوم وكان الطقس جميلا.", "القاهرة هي عاصمة جمهورية مصر العربية.",
               "أحب قراءة الكتب في المساء."],
    "russian": ["Мы сегодня гуляли в парке, и погода была прекрасной.", "Москва — столица Российской Федерации.",
                "Я люблю читать книги по вечерам."],
    "emoji": ["😀 😂 🎉 ❤️ 👍🏽", "🔥🔥🔥 💯 🙏", "🌞 🌈 ☕️"],
}  # fmt: skip
ERROR_PREFIX = "robust-pretrain-pos-mlm: error: "


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def recipe_argv(train: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--train_file", str(train), "--validation_file", str(train), "--vocab_size", "300", "--model_size", "tiny",
        "--max_seq_length", "32", "--max_steps", "2", "--per_device_train_batch_size", "4", "--warmup_steps", "0",
        "--logging_steps", "1", "--use_cpu", "true", "--disable_tqdm", "true", "--output_dir", str(output_dir),
        *extra,
    ]  # fmt: skip


def refusal(capsys) -> str:
    """The one error line of a refused run (nothing else it printed is an error or a traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1, err
    return errors[0][len(ERROR_PREFIX) :]


@pytest.mark.parametrize("language", sorted(FOREIGN_TEXTS))
def test_text_in_another_script_is_refused_before_training(tmp_path, capsys, language):
    train = write_lines(tmp_path / f"{language}.txt", FOREIGN_TEXTS[language] * 40)
    output_dir = tmp_path / "out"
    assert recipe.main(recipe_argv(train, output_dir)) == 2
    message = refusal(capsys)
    assert message.startswith(f"the train data ({train}) contains no word of the tasks ['verb', 'noun'")
    assert re.search(r"none of the \d+ words in it belongs to one \(English text has 82\.6% of its words", message)
    assert not output_dir.exists()


def test_text_with_a_few_english_words_among_foreign_ones_is_refused_with_the_figures(tmp_path, capsys):
    lines = ["北京 是 中国 的 首都 ， 我 喜欢 London 。", "他 每天 早上 七点 起床 ， 然后 去 school 。"]
    train = write_lines(tmp_path / "mostly-chinese.txt", lines * 40)
    output_dir = tmp_path / "out"
    assert recipe.main(recipe_argv(train, output_dir)) == 2
    message = refusal(capsys)
    # 2 English nouns among 20 words: 10%, where English text has 82.6% of its words in the nine tasks
    pattern = (
        rf"the train data \({re.escape(str(train))}\) does not look like English text: ([\d.]+)% of the (\d+) words in "
        r"it belong to a task, where English text has 82\.6% \(at least 27\.5% is accepted\)"
    )
    found = re.match(pattern, message)
    assert found and 9 <= float(found[1]) <= 11 and 780 <= int(found[2]) <= 840, message
    assert not output_dir.exists()


def test_english_words_of_mixed_text_get_their_tasks_and_foreign_ones_none(wordpiece_tokenizer):
    english = "We went to the old park and watched the children ."
    text = f"{english} {FOREIGN_TEXTS['chinese'][0]} {english} Мы гуляли в парке."
    features = tokenize_and_tag(Dataset.from_dict({"text": [text]}), wordpiece_tokenizer, pack=False)[0]
    encoded = wordpiece_tokenizer(text, return_offsets_mapping=True)
    assert encoded["input_ids"] == features["input_ids"]
    tasks = {"went": 0, "park": 1, "old": 2, "the": 3, "to": 6, "and": 7, "watched": 0, "children": 1}
    spans = word_spans(text)
    english_words, foreign_tokens = set(), 0
    for (start, end), task in zip(encoded["offset_mapping"], features["token_task_ids"], strict=True):
        if end == start:  # special token
            continue
        word_start, word_end = next(span for span in spans if span[0] <= start < span[1])
        word = text[word_start:word_end]
        if word.lower() in tasks:
            assert task == tasks[word.lower()], word
            english_words.add(word_start)
        elif not word.isascii():
            assert task == -1, word
            foreign_tokens += 1
    assert len(english_words) == 18 and foreign_tokens > 10


@pytest.mark.slow
def test_mixed_english_and_chinese_text_trains(tmp_path, capsys):
    english = [t.replace("\n", " ") for t in load_ewt_corpus("train")["text"][:60]]
    mixed = [line for pair in zip(english, FOREIGN_TEXTS["chinese"] * 15, strict=True) for line in pair]
    train = write_lines(tmp_path / "mixed.txt", mixed)
    output_dir = tmp_path / "out"
    assert recipe.main(recipe_argv(train, output_dir)) == 0, capsys.readouterr().err[-3000:]
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [1, 2]
    report = json.loads((output_dir / "task_report.json").read_text())
    assert report  # the run wrote its task report


def test_a_long_text_tags_in_pieces_like_the_whole_text():
    text = " ".join(t.replace("\n", " ") for t in load_ewt_corpus("test")["text"][:200])  # about 47,000 characters
    pieces = text_pieces(text, 2000)
    assert "".join(pieces) == text and len(pieces) >= 20 and max(map(len, pieces)) <= 2000
    assert sum(piece.rstrip()[-1] in ".!?" for piece in pieces) >= 0.9 * len(pieces)  # mostly at sentence ends
    tagger = get_tagger()
    whole = [(text[start:end], tag) for start, end, tag in tagger([text])[0]]
    in_pieces = [
        (piece[start:end], tag)
        for piece, words in zip(pieces, tagger(pieces), strict=True)
        for start, end, tag in words
    ]
    assert len(in_pieces) == len(whole)
    assert sum(a != b for a, b in zip(in_pieces, whole, strict=True)) <= len(whole) // 500  # cuts within sentences only


LONG_LINE_SCRIPT = """
import json, resource, sys, tempfile, time
from datasets import load_dataset
from transformers import AutoTokenizer
from robust_pretrain.data import tokenize_and_tag
from robust_pretrain.data.preprocessing import task_word_counts
path, tokenizer = sys.argv[1:3]
dataset = load_dataset("text", data_files=path, split="train", cache_dir=tempfile.mkdtemp())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
tagged = tokenize_and_tag(dataset, AutoTokenizer.from_pretrained(tokenizer), max_seq_length=128, pack=True,
                          batch_size=100)
print(json.dumps({"seconds": time.monotonic() - started, "blocks": len(tagged),
                  "peak_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                  "counts": task_word_counts(tagged)}))
"""


def tag_file(path: Path, tokenizer: Path) -> dict:
    command = [sys.executable, "-c", LONG_LINE_SCRIPT, str(path), str(tokenizer)]
    done = subprocess.run(command, capture_output=True, text=True, env=checkout_env(OMP_NUM_THREADS="1"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_one_huge_line_is_tagged_with_the_memory_and_time_of_many_lines(tmp_path, wordpiece_tokenizer):
    """A 4 MB line of 0.7 M words is cut into pieces: its peak memory does not grow with its length, and it takes
    about as long as the same text in 300-character lines."""
    corpus = " ".join(t.replace("\n", " ") for t in load_ewt_corpus("train")["text"])
    text = (corpus * 4)[:4_000_000]
    tokenizer = tmp_path / "tokenizer"
    wordpiece_tokenizer.save_pretrained(tokenizer)
    long_line = tag_file(write_lines(tmp_path / "line.txt", [text]), tokenizer)
    short_lines = tag_file(write_lines(tmp_path / "lines.txt", re.findall(r".{1,300}(?:\s|$)", text)), tokenizer)
    assert abs(long_line["blocks"] - short_lines["blocks"]) <= 0.01 * short_lines["blocks"]
    assert long_line["counts"][1] > 600_000
    assert long_line["peak_growth_mb"] < short_lines["peak_growth_mb"] + 150, (long_line, short_lines)
    assert long_line["seconds"] < 1.5 * short_lines["seconds"] + 10, (long_line, short_lines)


@pytest.fixture(scope="module")
def wordpiece_tokenizer():
    texts = [t.replace("\n", " ") for t in load_ewt_corpus("train")["text"][:2000]]
    return train_wordpiece_tokenizer(texts, 2000)


def test_task_word_counts_count_each_word_once(wordpiece_tokenizer):
    texts = ["The children played happily .", "Unbelievably , 42 !"]
    tagged = tokenize_and_tag(Dataset.from_dict({"text": texts}), wordpiece_tokenizer, pack=False)
    # words: The children played happily . | Unbelievably , 42 ! -> task words: 4 + 1
    assert task_word_counts(tagged) == (5, 9)
    assert task_word_counts(tagged, max_rows=1) == (4, 5)


def test_a_huge_line_without_packing_is_truncated_like_its_start(wordpiece_tokenizer):
    corpus = " ".join(t.replace("\n", " ") for t in load_ewt_corpus("train")["text"])
    texts = [(corpus * 4)[:4_000_000], corpus[:20_000]]  # the first is read only as far as truncation needs
    huge, start = tokenize_and_tag(Dataset.from_dict({"text": texts}), wordpiece_tokenizer, max_seq_length=128)
    assert len(huge["input_ids"]) == 128 and huge == start
