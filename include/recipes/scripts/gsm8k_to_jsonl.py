"""Write GSM8K (one subset) as JSONL with the final answer only; runs on the Ray head inside the NeMo RL image.

NeMo RL v0.5.0 loads `.jsonl` files natively but cannot pass a subset to an HF dataset id; and its math
environment grades `\\boxed{answer}`, so the answer must be the number after `####`, not the worked solution.
Idempotent: existing files are kept, so a retried job does not rewrite them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path


def final_answer(solution: str) -> str:
    """The text after GSM8K's `####` marker, without thousands separators."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer without '####': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_rows(records: Iterable[dict[str, str]]) -> Iterator[dict[str, str]]:
    """GSM8K records as {question, answer} rows with the final answer only."""
    for record in records:
        yield {"question": record["question"], "answer": final_answer(record["answer"])}


def write_jsonl(rows: Iterable[dict[str, str]], path: Path) -> int:
    """Write rows atomically (temp file, then rename); returns the row count."""
    tmp = path.with_suffix(".jsonl.tmp")
    count = 0
    with tmp.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
            count += 1
    os.replace(tmp, path)
    return count


def main() -> None:
    """Download one GSM8K subset and write train.jsonl and test.jsonl under --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", default="main")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from datasets import load_dataset  # present in the NeMo RL image

    for split in ("train", "test"):
        path = args.out / f"{split}.jsonl"
        if path.exists():
            print(f"{path} exists, keeping it")
            continue
        count = write_jsonl(to_rows(load_dataset("openai/gsm8k", args.subset, split=split)), path)
        print(f"wrote {count} rows to {path}")


if __name__ == "__main__":
    main()
