"""A tokenizer and a text dataset for TorchTitan's trainer, made locally.

``python assets.py DIR --seq-len S --documents N --global-batch G --dp 1 2 4`` writes
``DIR/tokenizer`` (``--model.hf_assets_path``) and, for each data-parallel degree D,
``DIR/data-dpD`` (``--training.dataset c4_test --training.dataset_path``).

The tokenizer is word-level, so every document is exactly ``S + 1`` tokens once the
trainer has added BOS and EOS: each document is one training sample. TorchTitan's data
loader gives data-parallel rank ``r`` the ``r``-th contiguous slice of the documents; the
file for degree D is ordered so that these slices, taken ``G / D`` at a time, are the
batches of ``G`` that a single process reads in order from ``data-dp1``. Runs with any
data-parallel degree then see the same global batch at every step, and their losses can
be compared with one process's.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = 400  # the debug model has 2048 embeddings


def write_tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": 3 + i for i in range(WORDS)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def documents(count: int, seq_len: int, seed: int = 0) -> list[str]:
    """``count`` documents of ``seq_len - 1`` words, from a small random bigram model (so
    that there is something to learn)."""
    rng = random.Random(seed)
    follow = {i: rng.sample(range(WORDS), 4) for i in range(WORDS)}
    docs = []
    for _ in range(count):
        word = rng.randrange(WORDS)
        words = []
        for _ in range(seq_len - 1):
            words.append(f"w{word}")
            word = rng.choice(follow[word])
        docs.append(" ".join(words))
    return docs


def rank_order(docs: list[str], dp: int, local_batch: int) -> list[str]:
    """The file order that makes ``dp`` contiguous slices read ``local_batch`` at a time
    equal to one reader taking ``dp * local_batch`` at a time from ``docs``."""
    per_rank = len(docs) // dp
    assert per_rank * dp == len(docs) and per_rank % local_batch == 0
    ordered = [None] * len(docs)
    for index, doc in enumerate(docs):
        step, within = divmod(index, dp * local_batch)
        rank, slot = divmod(within, local_batch)
        ordered[rank * per_rank + step * local_batch + slot] = doc
    return ordered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--documents", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--dp", type=int, nargs="+", required=True)
    args = parser.parse_args()
    write_tokenizer(args.folder / "tokenizer")
    docs = documents(args.documents, args.seq_len)
    for dp in args.dp:
        data = args.folder / f"data-dp{dp}"
        data.mkdir(parents=True, exist_ok=True)
        with open(data / "train.jsonl", "w") as out:
            for doc in rank_order(docs, dp, args.global_batch // dp):
                out.write(json.dumps({"text": doc}) + "\n")


if __name__ == "__main__":
    main()
