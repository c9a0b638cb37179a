"""GPU time per decode token by kernel, from Nsight Compute's CSV (issue 6: how much of a
token's wall time the kernels themselves take, and how much is the gaps between them).

    ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base \
        --launch-skip N --launch-count M redlite bench ... > ncu.csv
    python3 scripts/device/ncu_kernels.py ncu.csv PER_TOKEN_KERNEL

PER_TOKEN_KERNEL: a kernel name that runs once per decode token (the count of its launches
is the number of tokens the window covers). Prints the kernels by total time and the sum
per token.
"""

import csv
import sys
from collections import defaultdict


def main(path, per_token):
    rows = []
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0].split("<")[0].removeprefix("void ")
        rows.append((name, float(row["Metric Value"].replace(",", ""))))
    if not rows:
        print("no gpu__time_duration rows found")
        return
    tokens = sum(1 for name, _ in rows if name == per_token)
    totals = defaultdict(lambda: [0, 0.0])
    for name, ns in rows:
        totals[name][0] += 1
        totals[name][1] += ns
    tokens = max(tokens, 1)
    total_ns = sum(ns for _, ns in rows)
    print(f"{len(rows)} kernels over {tokens} tokens ({per_token} count)")
    print(f"{'kernel':<40} {'per token':>9} {'us each':>8} {'us/token':>9}")
    for name, (count, ns) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<40} {count / tokens:>9.1f} {ns / count / 1e3:>8.2f} {ns / tokens / 1e3:>9.1f}")
    print(f"kernel time per token: {total_ns / tokens / 1e3:.1f} us "
          f"({len(rows) / tokens:.0f} kernels)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
