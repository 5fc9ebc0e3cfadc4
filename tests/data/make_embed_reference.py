"""Writes tests/data/all_minilm_l6_v2_reference.json: sentence-transformers' own embeddings of
a few varied texts by all-MiniLM-L6-v2 (the folder EMBED_MODEL unpacks), the reference that
tests/engine/test_embed_model.py holds Podium's GGUF to without installing torch.

Run once, in a venv of its own (torch and sentence-transformers are no dependency of Podium):

    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch==2.13.0 sentence-transformers==6.2.0
    /tmp/st/bin/python tests/data/make_embed_reference.py ~/.cache/podium/all-MiniLM-L6-v2 \\
        > tests/data/all_minilm_l6_v2_reference.json
"""

import json
import sys

import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I reverse a linked list in Python?",
    "def add(a, b):\n    return a + b  # sum two numbers",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "I can't believe it's already 2024 \u2014 time flies! Prices rose 3.5% (about $12.99).",
    "hello",
    "Caf\u00e9 cr\u00e8me \u00e0 Z\u00fcrich, na\u00efve r\u00e9sum\u00e9",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002",
    "The committee postponed its decision on the new zoning regulations until next month, "
    "citing unresolved concerns from residents about traffic, noise, and the loss of green "
    "space near the river, while developers argued that further delays would raise "
    "construction costs and push the project's completion well into the following year.",
]


def main(folder: str) -> None:
    model = SentenceTransformer(folder, device="cpu")
    # the model's own modules run, its Normalize module included
    vectors = model.encode(TEXTS, convert_to_numpy=True)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    json.dump({
        "made_by": "tests/data/make_embed_reference.py (see its docstring for the command), "
                   "SentenceTransformer(folder).encode(texts) on CPU",
        "versions": {"sentence-transformers": sentence_transformers.__version__,
                     "transformers": transformers.__version__, "torch": torch.__version__},
        "max_seq_length": model.max_seq_length,
        "items": [{"text": text, "token_ids": model.tokenizer(text)["input_ids"],
                   "embedding": [round(float(x), 7) for x in vector]}
                  for text, vector in zip(TEXTS, vectors)],
    }, sys.stdout, ensure_ascii=False, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
