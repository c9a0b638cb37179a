"""cuBLAS at the shapes of redlite's dense prompt products (issue 7 item 3), on the GPU machine.

Reads the per-shape table that `REDLITE_CUDA_PROFILE=1 redlite bench ...` prints to stderr
(lines like `12.3 ms  4.1 %  48 x  257.19 us  matmul mma IQ2XXS 8192x2048 t512`), then times, with CUDA
events through PyTorch, what a cuBLAS path would run at each shape: the f16 GEMM
(tokens x cols) @ (cols x rows) and the int8 GEMM (cuBLASLt, torch._int_mm), without the
dequantization of the weights or the quantization of the activations that such a path would
add. If our kernel is faster than cuBLAS's GEMM alone, it is faster than the whole path.

    python3 scripts/device/cublas_shapes.py PROFILE_STDERR
"""

import re
import sys

import torch

LINE = re.compile(
    r"^\s*[\d.]+ ms\s+[\d.]+ %\s+\d+ x\s+(?P<us>[\d.]+) us\s+"
    r"matmul (?P<kind>.+?) (?P<rows>\d+)x(?P<cols>\d+) t(?P<tokens>\d+)\s*$"
)


def ms_per_call(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main(path):
    ours = {}
    for line in open(path, errors="replace"):
        m = LINE.match(line.rstrip())
        if m and int(m["tokens"]) >= 16:
            key = (m["kind"], int(m["rows"]), int(m["cols"]), int(m["tokens"]))
            ours[key] = float(m["us"]) / 1000.0
    if not ours:
        print("no matmul shapes with 16+ tokens in", path)
        return
    print("| kernel (ours) | rows x cols | tokens | ours ms | cuBLAS f16 ms | cuBLASLt int8 ms | faster |")
    print("|---|---|---|---|---|---|---|")
    for (kind, rows, cols, tokens), ms in sorted(ours.items(), key=lambda kv: (kv[0][3], -kv[1])):
        x = torch.randn(tokens, cols, device="cuda", dtype=torch.float16)
        w = torch.randn(cols, rows, device="cuda", dtype=torch.float16)
        f16 = ms_per_call(lambda: torch.matmul(x, w))
        int8 = float("nan")
        if tokens > 16 and rows % 8 == 0 and cols % 8 == 0:
            xi = torch.randint(-127, 128, (tokens, cols), device="cuda", dtype=torch.int8)
            wi = torch.randint(-127, 128, (cols, rows), device="cuda", dtype=torch.int8)
            try:
                int8 = ms_per_call(lambda: torch._int_mm(xi, wi))
            except RuntimeError:
                pass
        best = min(f16, int8) if int8 == int8 else f16
        faster = "ours" if ms <= best else "cuBLAS"
        print(f"| {kind} | {rows}x{cols} | {tokens} | {ms:.4f} | {f16:.4f} | {int8:.4f} | {faster} |")


if __name__ == "__main__":
    main(sys.argv[1])
