"""GPU time per decode token by kernel, from Nsight Compute's CSV (issue 6: how much of a
token's wall time the kernels themselves take, and how much is the gaps between them).

    ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base \
        --launch-skip N --launch-count M redlite bench ... > ncu.csv
    python3 scripts/device/ncu_kernels.py ncu.csv PER_TOKEN_KERNEL [--by-grid] [--skip-batches N]

PER_TOKEN_KERNEL: a kernel name that runs once per decode token (the count of its launches
is the number of tokens the window covers). Prints the kernels by total time and the sum
per token; with --by-grid each kernel's launches are told apart by grid size (which matrix
shape a product was, for instance); with --skip-batches N the launches before the (N+1)-th
PER_TOKEN_KERNEL launch are left out (a graph's recording, cold caches).
"""

import csv
import sys
from collections import defaultdict


def main(path, per_token, by_grid=False, skip=0):
    rows = []
    seen = 0
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0].split("<")[0].removeprefix("void ")
        ns = float(row["Metric Value"].replace(",", ""))
        tokens_name = name
        if name == per_token:
            seen += 1
        if seen <= skip:
            continue
        if by_grid:
            name = f"{name} {row.get('Grid Size', '?').replace(' ', '')}"
        rows.append((name, tokens_name, ns))
    if not rows:
        print("no gpu__time_duration rows found")
        return
    tokens = sum(1 for _, plain, _ in rows if plain == per_token)
    totals = defaultdict(lambda: [0, 0.0])
    for name, _, ns in rows:
        totals[name][0] += 1
        totals[name][1] += ns
    tokens = max(tokens, 1)
    total_ns = sum(ns for _, _, ns in rows)
    print(f"{len(rows)} kernels over {tokens} tokens ({per_token} count)")
    width = 56 if by_grid else 40
    print(f"{'kernel':<{width}} {'per token':>9} {'us each':>8} {'us/token':>9}")
    for name, (count, ns) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<{width}} {count / tokens:>9.1f} {ns / count / 1e3:>8.2f} "
              f"{ns / tokens / 1e3:>9.1f}")
    print(f"kernel time per token: {total_ns / tokens / 1e3:.1f} us "
          f"({len(rows) / tokens:.0f} kernels)")


if __name__ == "__main__":
    args = sys.argv[3:]
    skip = int(args[args.index("--skip-batches") + 1]) if "--skip-batches" in args else 0
    main(sys.argv[1], sys.argv[2], "--by-grid" in args, skip)
