#!/usr/bin/env bash
# Replays traces through this pool and every peer allocator side by side on
# one NVIDIA GPU with PyTorch (and nvcc, for CUB), and writes
# $OUT/results.json and $OUT/RESULTS.md (logs in $OUT/logs). Needs
# bin/tlsf-stress and bin/libtlsf.so, built elsewhere by `make bench-gpu`;
# no Go toolchain here.
#
#   bench/peers/run.sh                      # lstm, resnet50, tdnn: the full run (about 8 minutes)
#   bench/peers/run.sh --quick              # smoke run: one trace, 3 warm replays, no bisection
#   bench/peers/run.sh my.snapshot.pickle   # any trace tlsf-stress reads
#   bench/peers/run.sh --help               # every option (peers.py run)
#
# Environment: OUT (default out/peers), BIN (default bin; a relative BIN is
# taken from the repository root), PYTHON (default
# python3), TLSF_PEERS_BUILD (the extensions' build directory, default
# out/peers-build, git-ignored: kept between runs, so a second run skips
# the compilation).
set -uo pipefail
# Trace files may be named relative to the caller's directory.
args=()
for a in "$@"; do
	if [ -f "$a" ]; then a=$(cd "$(dirname "$a")" && pwd)/$(basename "$a"); fi
	args+=("$a")
done
case ${OUT:-} in "" | /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/peers}
BIN=${BIN:-bin}
PYTHON=${PYTHON:-python3}
export TLSF_PEERS_BUILD=${TLSF_PEERS_BUILD:-$PWD/out/peers-build}
mkdir -p "$OUT"
for f in "$BIN/tlsf-stress"; do
	[ -x "$f" ] || { echo "run.sh: $f missing: run 'make bench-gpu' on a machine with Go and copy bin/" >&2; exit 2; }
done
[ -e "$BIN/libtlsf.so" ] || echo "run.sh: $BIN/libtlsf.so missing: the C ABI rows will say so; the others run" >&2
exec "$PYTHON" bench/peers/peers.py run --out "$OUT" --bin "$BIN" ${args[@]+"${args[@]}"}
