#!/usr/bin/env bash
# Runs CUDA kernels on the host, without a GPU (scripts/dev/*-emu: each module's source
# compiled as C++ with stand-ins for the CUDA built-ins, every CUDA thread a host thread):
# the decode kernels against the launches they replace, bit for bit (decode-emu), the
# DeltaNet kernels (deltanet-emu), the flash prefill attention (attention-emu) and the int8
# tensor-core products (mma-emu) against references. A kernel whose indexing, barriers or
# order of sums breaks fails here, not only on the GPU machine. About 9 minutes on 2 cores.
#
# Usage: scripts/ci/kernels-on-host.sh [EMULATOR...]   (default: decode deltanet attention mma)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
emulators=("$@")
[ ${#emulators[@]} -gt 0 ] || emulators=(decode deltanet attention mma)
for emulator in "${emulators[@]}"; do
    start=$SECONDS
    echo "kernels-on-host: $emulator"
    if ! output="$(bash "scripts/dev/$emulator-emu/run.sh" 2>&1)"; then
        printf '%s\n' "$output"
        echo "kernels-on-host: $emulator FAILED"
        exit 1
    fi
    printf '%s\n' "$output" | grep -v '^ok ' || true
    echo "kernels-on-host: $emulator passed ($((SECONDS - start)) s)"
done
