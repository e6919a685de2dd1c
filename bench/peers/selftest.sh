#!/usr/bin/env bash
# Checks the harness's Python and its outputs without a GPU: a fake torch
# (testdata/faketorch: allocators simulated in Python, the replay loop in
# Python), a fake libtlsf.so (testdata/fake_tlsf.c, built with cc) and the
# real tlsf-stress on the simulated GPU. It exercises export, the builds,
# every child, the bisection, the Go rows, a CUB that fails to build, a
# missing libtlsf.so, results.json, RESULTS.md and readme_tables.py; it
# measures nothing. Needs Go, cc and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/nolib" "$T/real"
cc -shared -fPIC -o "$T/bin/libtlsf.so" bench/peers/testdata/fake_tlsf.c
go build -o "$T/bin/tlsf-stress.real" ./cmd/tlsf-stress
cat >"$T/bin/tlsf-stress" <<EOS
#!/bin/sh
# the real tlsf-stress, replaying on the simulated GPU
if [ "\$1" = replay ]; then shift; exec "$T/bin/tlsf-stress.real" replay "\$@" --device sim; fi
exec "$T/bin/tlsf-stress.real" "\$@"
EOS
chmod +x "$T/bin/tlsf-stress"
cp "$T/bin/tlsf-stress" "$T/bin/tlsf-stress.real" "$T/nolib/"
echo selftest >"$T/bin/VERSION"
export PYTHONPATH="$PWD/bench/peers/testdata/faketorch" TLSF_PEERS_BUILD="$T/build"
check() { python3 - "$@" <<'EOP'
import json, sys
out, want_ok, want_fail = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",") if sys.argv[3] else []
r = json.load(open(out + "/results.json"))
md = open(out + "/RESULTS.md").read()
rows = {(x["allocator"], x["trace"]): x for x in r["results"]}
traces = [t["trace"] for t in r["traces"]]
for t in traces:
    for a in want_ok:
        x = rows.get((a, t))
        assert x and x.get("ok") and x.get("warm_ns_per_op_median"), (a, t, x)
        assert x.get("peak_reserved_over_live"), (a, t, x)
        if r["bisection"] and a in ("tlsf-vmm", "tlsf-chunks", "torch", "async", "tlsf-vmm-go"):
            assert x.get("min_cap_over_live", 0) >= 1.0, (a, t, x)
    for a in want_fail:
        x = rows.get((a, t))
        assert x and not x.get("ok") and x.get("error"), (a, t, x)
    assert "## %s " % t in md
assert "<!-- peers-table:begin -->" in md and "<!-- peers-table:end -->" in md
print("selftest: %s: %d rows on %s: ok" % (out, len(r["results"]), ", ".join(traces)))
EOP
}
ALL=tlsf-vmm,tlsf-chunks,torch,torch+expandable,async,cub_pow2,cuda,cub_default,tlsf-vmm-go,tlsf-chunks-go
OUT="$T/quick" BIN="$T/bin" bench/peers/run.sh --quick 2>"$T/quick.err"
check "$T/quick" "$ALL" ""
OUT="$T/full" BIN="$T/bin" bench/peers/run.sh lstm internal/trace/testdata/small.snapshot.pickle 2>"$T/full.err"
check "$T/full" "$ALL" ""
FAKE_FAIL_CUB=1 OUT="$T/broken" BIN="$T/nolib" bench/peers/run.sh --quick tdnn 2>"$T/broken.err"
check "$T/broken" torch,torch+expandable,async,cuda,tlsf-vmm-go,tlsf-chunks-go tlsf-vmm,tlsf-chunks,cub_pow2,cub_default
# The real C ABI, where capi/ is here: libtlsf.so on the simulated GPU.
if [ -d capi ] && CGO_ENABLED=1 go build -buildmode=c-shared -o "$T/real/libtlsf.so" ./capi; then
	cp "$T/bin/tlsf-stress" "$T/bin/tlsf-stress.real" "$T/bin/VERSION" "$T/real/"
	TLSF_PEERS_CONF=device:sim OUT="$T/capi" BIN="$T/real" bench/peers/run.sh --only tlsf-vmm,tlsf-chunks lstm 2>"$T/capi.err"
	check "$T/capi" tlsf-vmm,tlsf-chunks ""
else
	echo "selftest: no capi/ (or it does not build): the real libtlsf.so is not checked"
fi
cp README.md "$T/README.md"
python3 bench/peers/readme_tables.py --results "$T/full/RESULTS.md" --readme "$T/README.md" >/dev/null
python3 bench/peers/readme_tables.py --results "$T/full/RESULTS.md" --readme "$T/README.md" --check
grep -q "| lstm | warm ns/op (median) |" "$T/README.md"
echo "selftest: ok"
