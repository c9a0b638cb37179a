"""Drift between two `redlite logits --out` files (f32 rows of the vocabulary, 151,936 for the
full-size model): the worst relative L2 distance over positions and how many positions
keep the same argmax.

    python3 scripts/device/logits_drift.py A.bin B.bin [VOCAB]
"""

import array
import math
import sys


def main(a_path, b_path, vocab=151936):
    raw_a, raw_b = (open(p, "rb").read() for p in (a_path, b_path))
    if raw_a == raw_b:
        print(f"bit-identical ({len(raw_a) // 4 // vocab} positions)")
        return
    a, b = array.array("f", raw_a), array.array("f", raw_b)
    if len(a) != len(b) or len(a) % vocab:
        print(f"sizes differ or are not whole rows: {len(a)} and {len(b)} floats")
        return
    rows = len(a) // vocab
    worst, same = 0.0, 0
    for r in range(rows):
        x, y = a[r * vocab:(r + 1) * vocab], b[r * vocab:(r + 1) * vocab]
        num = sum((p - q) ** 2 for p, q in zip(x, y))
        den = sum(p * p for p in x)
        worst = max(worst, math.sqrt(num / max(den, 1e-30)))
        same += max(range(vocab), key=x.__getitem__) == max(range(vocab), key=y.__getitem__)
    print(f"max rel L2 {worst:.2e} over {rows} positions, same argmax {same}/{rows}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(v) for v in sys.argv[3:4]))
