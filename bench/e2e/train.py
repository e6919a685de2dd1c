#!/usr/bin/env python3
"""End-to-end training on three CUDA allocators: PyTorch's native caching
allocator, the same with expandable_segments:True, and the tlsf pool
(libtlsf.so through python/tlsf_torch.py; --allocators tlsf-goodfit adds
the pool with good_fit:true, TLSF's O(1) good fit).

Two models, random weights, no network:
  - resnet50: torchvision ResNet-50, batch varying 16-128 at 224x224;
  - gpt2: transformers GPT-2 small (GPT2Config()), batch 8, sequence length
    varying 128-1024.

Per model and allocator, each in its own process:
  - median step time (ms) over the steps after the warm-up ones, and
    against the native allocator the median of step-by-step ratios (all
    runs follow one schedule of batch sizes, so step i is the same work
    in each);
  - peak reserved bytes (PyTorch: torch.cuda.max_memory_reserved(); tlsf:
    its statistics, peak_reserved);
  - the largest batch that trains (4 steps with varying sizes, up to that
    batch) under a fixed memory cap (PyTorch:
    set_per_process_memory_fraction; tlsf: max_bytes), found by bisection,
    each probe in a fresh process (an out-of-memory error must not poison
    the others; tlsf returns NULL on out of memory, which PyTorch's
    pluggable allocator does not check, so such a probe fails with a CUDA
    error instead), the probes of all models and allocators of one round
    running at once;
  - the losses, compared bit for bit with the native allocator's for the
    same seed (deterministic algorithms on); a second native run shows
    whether the model is deterministic at all.

Writes results.json and results.md into --out. Everything fits in one
10-minute command on an H200 (--budget bounds it: late bisection rounds are
skipped, and the table says so). --quick runs a few steps and one probe
round of each, as a smoke test.

    python3 bench/e2e/train.py --lib bin/libtlsf.so --out "$OUT"
    python3 bench/e2e/train.py --lib bin/libtlsf.so --out "$OUT" --quick
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ALLOCATORS = ["native", "expandable", "tlsf"]
# The pool's configurations (TLSF_ALLOC_CONF keys) by allocator name;
# tlsf-goodfit (not run by default) is TLSF's good fit with 1 MiB caches,
# the default before best fit.
TLSF_CONF = {"tlsf": [], "tlsf-goodfit": ["good_fit:true"]}
MODELS = ["resnet50", "gpt2"]
GIB = 1 << 30

# What "batch" means per model: ResNet-50 images of 224x224; GPT-2
# sequences (batch 8 in training; in probes, sequences of up to 1024
# tokens).
TRAIN_SIZES = {
    "resnet50": list(range(16, 129, 8)),  # batch
    "gpt2": list(range(128, 1025, 64)),  # sequence length, batch 8
}
GPT2_TRAIN_BATCH = 8
# The variable that turns expandable segments on (--expandable-env).
EXPANDABLE_ENV = "PYTORCH_ALLOC_CONF"


# ---------------------------------------------------------------- worker


def worker(spec):
    """Runs in a child process: one training run or one probe. Writes a
    JSON result to spec["result"]."""
    result = {"status": "error", "error": ""}
    try:
        result = _work(spec)
    except BaseException as e:  # report anything: the parent decides
        result = {"status": "error", "error": "%s: %s" % (type(e).__name__, str(e)[:2000])}
        try:
            result["status"] = _classify(e, spec)
            if spec["allocator"].startswith("tlsf"):
                result["tlsf_error"] = _tlsf_last_error()
        except BaseException:
            pass
    with open(spec["result"], "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    # Leave without running destructors: after a CUDA error, teardown may hang or crash.
    os._exit(0)


def _tlsf_last_error():
    try:
        import tlsf_torch

        return tlsf_torch.last_error()
    except Exception:
        return ""


def _classify(e, spec):
    """oom or error. After tlsf returned NULL (which PyTorch does not
    check), the step fails with a CUDA error instead; its statistics count
    the failed allocation, if the driver still answers."""
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "oom"
    if spec["allocator"].startswith("tlsf"):
        try:
            import tlsf_torch

            if tlsf_torch.stats()["num_ooms"] > 0:
                return "oom"
        except Exception:
            pass
    return "error"


def _setup_allocator(spec):
    """Must run before any CUDA work."""
    import torch

    if spec["allocator"].startswith("tlsf"):
        sys.path.insert(0, os.path.join(REPO, "python"))
        import tlsf_torch

        items = TLSF_CONF[spec["allocator"]] + (["max_bytes:%d" % spec["cap"]] if spec.get("cap") else [])
        conf = ",".join(items)
        tlsf_torch.install(lib=spec["lib"], conf=conf)
    torch.cuda.init()
    if spec.get("cap") and not spec["allocator"].startswith("tlsf"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap"] / total), 0)


def _deterministic(seed):
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def _build(model_name, spec):
    import torch

    if model_name == "resnet50":
        import torchvision

        class Mean(torch.nn.Module):
            """AdaptiveAvgPool2d(1) as a mean: the same values, and a
            deterministic backward (adaptive_avg_pool2d's uses atomics)."""

            def forward(self, x):
                return x.mean((2, 3), keepdim=True)

        model = torchvision.models.resnet50(weights=None)
        model.avgpool = Mean()
        model = model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        # Inputs drawn on the GPU (Philox, seeded): the same on every
        # allocator, and no host-side generation inside the timed step.
        gen = torch.Generator(device="cuda").manual_seed(spec["seed"] + 1)

        def step(size):
            x = torch.randn(size, 3, 224, 224, generator=gen, device="cuda")
            y = torch.randint(0, 1000, (size,), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return step
    if model_name == "gpt2":
        import transformers

        try:
            config = transformers.GPT2Config(attn_implementation=spec["gpt2_attn"])
        except TypeError:
            config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config).cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator(device="cuda").manual_seed(spec["seed"] + 1)

        def step(shape):
            batch, seq = shape
            ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            return loss

        return step
    raise ValueError("unknown model " + model_name)


def _memory(spec):
    import torch

    if spec["allocator"].startswith("tlsf"):
        import tlsf_torch

        s = tlsf_torch.stats(0)
        return {"peak_reserved": s["peak_reserved"], "peak_allocated": s["peak_allocated"], "tlsf": s}
    return {
        "peak_reserved": torch.cuda.max_memory_reserved(0),
        "peak_allocated": torch.cuda.max_memory_allocated(0),
    }


def _work(spec):
    import torch

    _setup_allocator(spec)
    _deterministic(spec["seed"])
    step = _build(spec["model"], spec)
    times, losses = [], []
    for shape in spec["schedule"]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(tuple(shape) if isinstance(shape, list) else shape)
        lv = loss.item()  # synchronizes
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(lv).hex())
        if spec["allocator"].startswith("tlsf"):
            import tlsf_torch

            if tlsf_torch.stats()["num_ooms"] > 0:
                return {"status": "oom", "error": "tlsf: " + tlsf_torch.last_error(), "steps": len(times)}
        if lv != lv:  # NaN: a step read garbage (a NULL allocation, say)
            return {"status": "error", "error": "loss is NaN", "steps": len(times)}
    out = {"status": "ok", "times": times, "losses": losses, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    out.update(_memory(spec))
    return out


# ---------------------------------------------------------------- parent


def _env(allocator):
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TLSF_ALLOC_CONF"):
        env.pop(k, None)
    if allocator == "expandable":
        # PyTorch 2.9 and later read PYTORCH_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF
        # is its deprecated alias); set one only.
        env[EXPANDABLE_ENV] = "expandable_segments:True"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


class Runner:
    """Starts worker processes and keeps the time budget."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.tmp = tempfile.mkdtemp(prefix="e2e-")
        self.n = 0

    def left(self):
        return self.args.budget - (time.monotonic() - self.t0)

    def start(self, spec):
        self.n += 1
        spec = dict(spec, result=os.path.join(self.tmp, "r%d.json" % self.n), lib=self.args.lib, seed=self.args.seed, gpt2_attn=self.args.gpt2_attn)
        # stderr to a file: a pipe that fills would stall a child while the
        # parent waits for another.
        spec["stderr"] = spec["result"] + ".err"
        with open(spec["stderr"], "w") as errf:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                env=_env(spec["allocator"]),
                stdout=subprocess.DEVNULL,
                stderr=errf,
            )
        return proc, spec

    def wait(self, started, timeout):
        """Waits for every started process; returns their results."""
        deadline = time.monotonic() + timeout
        out = []
        for proc, spec in started:
            try:
                proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                out.append({"status": "timeout", "error": "killed after %.0f s" % timeout, "stderr": _tail(spec["stderr"])})
                continue
            try:
                with open(spec["result"]) as f:
                    res = json.load(f)
            except (OSError, ValueError):
                res = {"status": "crash", "error": "exit status %s, no result" % proc.returncode}
            if res.get("status") != "ok":
                res["stderr"] = _tail(spec["stderr"])
            out.append(res)
        return out

    def run(self, spec, timeout):
        return self.wait([self.start(spec)], timeout)[0]


def _tail(path, n=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def train_schedule(model, steps, seed):
    r = random.Random(seed)
    sizes = [r.choice(TRAIN_SIZES[model]) for _ in range(steps)]
    if model == "gpt2":
        return [[GPT2_TRAIN_BATCH, s] for s in sizes]
    return sizes


def probe_schedule(model, batch):
    """Four steps up to `batch`, varying so that the allocator must reuse
    memory of other sizes: the case a cap makes hard."""
    if model == "gpt2":
        return [[batch, 1024], [batch, 384], [batch, 768], [batch, 1024]]
    return [batch, max(1, batch // 2), max(1, 3 * batch // 4), batch]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--lib", default=os.path.join(REPO, "bin", "libtlsf.so"), help="libtlsf.so (default: bin/libtlsf.so)")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"), help="directory for results.json and results.md (default: $OUT)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 4 steps, one probe round")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median (default 5)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--probes", type=int, default=7, help="bisection rounds (default 7)")
    ap.add_argument("--resnet-cap-gib", type=float, default=8.0, help="memory cap for the ResNet-50 bisection (default 8)")
    ap.add_argument("--resnet-range", default="32,256", help="ResNet-50 batch range searched (default 32,256)")
    ap.add_argument("--gpt2-cap-gib", type=float, default=24.0, help="memory cap for the GPT-2 bisection (default 24)")
    ap.add_argument("--gpt2-range", default="2,48", help="GPT-2 batch range (sequences of up to 1024 tokens) searched (default 2,48)")
    ap.add_argument("--gpt2-attn", default="eager", help="GPT-2 attention implementation (eager: deterministic)")
    ap.add_argument("--budget", type=float, default=560.0, help="seconds for everything (default 560)")
    ap.add_argument("--expandable-env", default=EXPANDABLE_ENV, help="PYTORCH_ALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF before PyTorch 2.9")
    args = ap.parse_args()
    globals()["EXPANDABLE_ENV"] = args.expandable_env

    if args.worker:
        worker(json.loads(args.worker))
        return

    if args.quick:
        args.steps, args.warmup, args.probes = 4, 1, 1
    args.lib = os.path.abspath(args.lib)
    if any(a.startswith("tlsf") for a in args.allocators.split(",")) and not os.path.exists(args.lib):
        sys.exit("train.py: %s not found: build it with make capi" % args.lib)
    os.makedirs(args.out, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    allocators = [a for a in args.allocators.split(",") if a]
    for a in allocators:
        if a not in ["native", "expandable"] + list(TLSF_CONF):
            sys.exit("train.py: unknown allocator %r (native, expandable, %s)" % (a, ", ".join(TLSF_CONF)))
    runner = Runner(args)
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args), "train": {}, "bisect": {}}

    # Training runs, one process at a time (they are timed). The native
    # allocator runs twice: the second run says whether the model is
    # deterministic at all.
    runs = [(m, a) for m in models for a in allocators]
    if "native" in allocators:
        runs += [(m, "native#2") for m in models]
    for model, alloc in runs:
        if runner.left() < 60:
            print("train.py: out of time before training %s on %s" % (model, alloc), flush=True)
            break
        spec = {"model": model, "allocator": alloc.split("#")[0], "schedule": train_schedule(model, args.steps, args.seed)}
        res = runner.run(spec, timeout=min(240, runner.left() - 30))
        if res.get("status") == "ok":
            t = res["times"][args.warmup :] or res["times"]
            res["median_step_ms"] = 1000 * statistics.median(t)
        results["train"].setdefault(model, {})[alloc] = res
        print(
            "train %-8s %-10s %-6s median %s ms, peak reserved %s GiB"
            % (
                model,
                alloc,
                res.get("status"),
                "%.1f" % res["median_step_ms"] if "median_step_ms" in res else "-",
                "%.2f" % (res["peak_reserved"] / GIB) if "peak_reserved" in res else "-",
            ),
            flush=True,
        )
        if res.get("status") != "ok":
            print("  %s\n  %s" % (res.get("error", ""), res.get("stderr", "")[-600:]), flush=True)

    # Bisection under the cap: [lo, hi] with lo known good (or untested
    # at the start) and hi known bad; all pairs of a round run at once.
    caps = {"resnet50": int(args.resnet_cap_gib * GIB), "gpt2": int(args.gpt2_cap_gib * GIB)}
    ranges = {"resnet50": [int(x) for x in args.resnet_range.split(",")], "gpt2": [int(x) for x in args.gpt2_range.split(",")]}
    state = {}
    for m in models:
        for a in allocators:
            lo, hi = ranges[m]
            # good: largest batch known to train; bad: smallest known not to
            state[(m, a)] = {"good": None, "bad": None, "lo": lo, "hi": hi, "probes": []}
    for rnd in range(args.probes):
        if runner.left() < 45:
            print("train.py: out of time after %d bisection rounds" % rnd, flush=True)
            break
        started = []
        for (m, a), st in state.items():
            # Unprobed ends count as good below the range, bad above it.
            lo = st["good"] if st["good"] is not None else st["lo"] - 1
            hi = st["bad"] if st["bad"] is not None else st["hi"] + 1
            if hi - lo <= 1:
                continue
            b = (lo + hi) // 2
            spec = {"model": m, "allocator": a, "schedule": probe_schedule(m, b), "cap": caps[m]}
            started.append(((m, a), b, runner.start(spec)))
        if not started:
            break
        outs = runner.wait([s[2] for s in started], timeout=min(180, runner.left() - 15))
        for ((m, a), b, _), res in zip(started, outs):
            st = state[(m, a)]
            ok = res.get("status") == "ok"
            st["probes"].append({"batch": b, "status": res.get("status"), "error": res.get("error", "")[:300]})
            if ok:
                st["good"] = b if st["good"] is None else max(st["good"], b)
            else:
                st["bad"] = b if st["bad"] is None else min(st["bad"], b)
            print("probe round %d %-8s %-10s batch %4d: %s" % (rnd, m, a, b, res.get("status")), flush=True)
    for (m, a), st in state.items():
        st["cap_bytes"] = caps[m]
        results["bisect"].setdefault(m, {})[a] = st

    # Losses, bit for bit against the native allocator's.
    for m, byalloc in results["train"].items():
        ref = byalloc.get("native", {}).get("losses")
        for a, res in byalloc.items():
            if ref is None or "losses" not in res:
                continue
            diff = [i for i, (x, y) in enumerate(zip(ref, res["losses"])) if x != y]
            res["losses_match_native"] = not diff and len(ref) == len(res["losses"])
            res["first_differing_step"] = diff[0] if diff else None

    results["elapsed_s"] = time.monotonic() - runner.t0
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results, models, allocators, caps)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md, flush=True)


def _fmt_batch(st):
    if st["good"] is None:
        return "< %d" % st["bad"] if st["bad"] is not None else "?"
    if st["bad"] is None:
        return ">= %d" % st["good"]
    if st["bad"] - st["good"] <= 1:
        return "%d" % st["good"]
    return "%d (< %d)" % (st["good"], st["bad"])


def step_ratio(res, base, warmup):
    """The median over the steps after warmup of res's step time over
    base's for the same step: every run follows one schedule, so step i
    has the same batch in each, and a step-by-step ratio compares like
    with like (the median step of a varying schedule may be another batch
    size in each run). None where either run has no times."""
    a, b = res.get("times", [])[warmup:], base.get("times", [])[warmup:]
    r = [x / y for x, y in zip(a, b) if y > 0]
    return statistics.median(r) if r else None


def table(results, models, allocators, caps):
    gpu, torch_v = "", ""
    for byalloc in results["train"].values():
        for res in byalloc.values():
            gpu, torch_v = res.get("gpu", gpu), res.get("torch", torch_v)
    lines = [
        "End-to-end training, %s, %s, PyTorch %s, %d steps (median over steps after %d), seed %d; %.0f s in all."
        % (results["date"], gpu or "GPU ?", torch_v or "?", results["args"]["steps"], results["args"]["warmup"], results["args"]["seed"], results["elapsed_s"]),
        "",
        "| model | allocator | median step (ms) | vs native | peak reserved (GiB) | vs expandable | largest batch under cap | losses = native |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for m in models:
        tr = results["train"].get(m, {})
        base = tr.get("native", {})
        warmup = results["args"]["warmup"]
        base_r = tr.get("expandable", {}).get("peak_reserved")
        for a in allocators + (["native#2"] if "native" in allocators else []):
            res = tr.get(a)
            if res is None:
                continue
            t = res.get("median_step_ms")
            ratio = step_ratio(res, base, warmup) if res.get("status") == "ok" and base.get("status") == "ok" else None
            r = res.get("peak_reserved")
            st = results["bisect"].get(m, {}).get(a)
            cap = "%s (cap %.0f GiB)" % (_fmt_batch(st), caps[m] / GIB) if st else ""
            match = res.get("losses_match_native")
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s | %s |"
                % (
                    m,
                    a if res.get("status") == "ok" else "%s (%s)" % (a, res.get("status")),
                    "%.1f" % t if t else "-",
                    "%+.1f%%" % (100 * (ratio - 1)) if ratio else "-",
                    "%.2f" % (r / GIB) if r else "-",
                    "%+.1f%%" % (100 * (r / base_r - 1)) if r and base_r else "-",
                    cap,
                    "-" if match is None else ("yes" if match else "no (step %s)" % res.get("first_differing_step")),
                )
            )
    lines += [
        "",
        "Batch: ResNet-50 images at 224x224 (training: 16-128, varying); GPT-2 small sequences"
        " (training: batch %d, length 128-1024 varying; under the cap: up to 1024 tokens)." % GPT2_TRAIN_BATCH,
        "Under the cap: 4 steps of varying size up to the batch, each probe a fresh process;"
        " PyTorch's cap is set_per_process_memory_fraction(cap / total), tlsf's max_bytes.",
        "native#2 is a second run of the native allocator: whether the model is deterministic at all.",
        "vs native: the median over the steps after %d of each step's time over the native allocator's for the same step"
        " (the same batch), not the ratio of median steps, which may be steps of different batches." % results["args"]["warmup"],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
