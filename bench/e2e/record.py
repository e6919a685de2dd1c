#!/usr/bin/env python3
"""Records PyTorch allocation traces of real workloads, beyond the three
shared ones, to check the pool on workloads it was not tuned on.

Each workload runs in its own process on PyTorch's native caching
allocator with torch.cuda.memory._record_memory_history() on from the
start (no stack frames), for --steps steps of varying size (batch,
sequence length or image size drawn from a seeded schedule: the pattern
that makes exact-size caching fragment), and writes
NAME.snapshot.pickle.gz (gzip of torch.cuda.memory._snapshot()), which
tlsf-stress replays as a trace and bench/peers/run.sh replays through
every peer; `tlsf-stress export --text` converts it to the text format of
bench/traces. Random weights, no network.

Workloads:
  - vit: torchvision ViT-B/16 training, SGD, batch 8-96 at 224x224;
  - mobilenet: torchvision MobileNetV3-Large training, batch 16-192;
  - deeplab: torchvision DeepLabV3-ResNet50 training, batch 4,
    images 256-640 square (varying activation shapes);
  - bert: transformers BERT-base masked-LM training, AdamW, batch 4-32,
    sequence 64-512;
  - llama-bf16: transformers Llama (8 layers, 1024 wide) training under
    bf16 autocast, batch 4, sequence 128-2048;
  - resnet50-infer: torchvision ResNet-50 inference (no_grad), batch
    1-256.

    python3 bench/e2e/record.py --out "$OUT/traces"
    python3 bench/e2e/record.py --out "$OUT/traces" --only vit,bert --steps 8
"""

import argparse
import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import time

WORKLOADS = ["vit", "mobilenet", "deeplab", "bert", "llama-bf16", "resnet50-infer"]


def schedule(name, steps, seed):
    rng = random.Random("%s/%d" % (name, seed))
    pick = {
        "vit": lambda: rng.randrange(8, 97, 8),
        "mobilenet": lambda: rng.randrange(16, 193, 16),
        "deeplab": lambda: rng.randrange(256, 641, 32),
        "bert": lambda: (rng.randrange(4, 33, 4), rng.randrange(64, 513, 32)),
        "llama-bf16": lambda: rng.randrange(128, 2049, 128),
        "resnet50-infer": lambda: rng.choice([1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256]),
    }[name]
    return [pick() for _ in range(steps)]


def build(name):
    """Returns step(size) for workload name; the model is on the GPU."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1)
    if name in ("vit", "mobilenet"):
        import torchvision

        model = (torchvision.models.vit_b_16 if name == "vit" else torchvision.models.mobilenet_v3_large)(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(batch):
            x = torch.randn(batch, 3, 224, 224, generator=gen, device="cuda")
            y = torch.randint(0, 1000, (batch,), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

        return step
    if name == "deeplab":
        import torchvision

        model = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(side):
            x = torch.randn(4, 3, side, side, generator=gen, device="cuda")
            y = torch.randint(0, 21, (4, side, side), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x)["out"], y).backward()
            opt.step()

        return step
    if name == "bert":
        import transformers

        config = transformers.BertConfig()
        model = transformers.BertForMaskedLM(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(shape):
            batch, seq = shape
            ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()

        return step
    if name == "llama-bf16":
        import transformers

        config = transformers.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
        model = transformers.LlamaForCausalLM(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(seq):
            ids = torch.randint(0, config.vocab_size, (4, seq), generator=gen, device="cuda")
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()

        return step
    if name == "resnet50-infer":
        import torchvision

        model = torchvision.models.resnet50(weights=None).cuda().eval()

        def step(batch):
            with torch.no_grad():
                x = torch.randn(batch, 3, 224, 224, generator=gen, device="cuda")
                model(x).argmax(1).cpu()

        return step
    raise ValueError("unknown workload " + name)


def child(name, steps, seed, out):
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    step = build(name)
    sizes = schedule(name, steps, seed)
    for s in sizes:
        step(tuple(s) if isinstance(s, list) else s)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    path = os.path.join(out, name + ".snapshot.pickle.gz")
    with gzip.open(path, "wb") as f:
        pickle.dump(snap, f)
    n = sum(len(t) for t in snap.get("device_traces", []))
    st = torch.cuda.memory_stats()
    print(json.dumps({
        "workload": name, "steps": steps, "sizes": sizes, "events": n, "file": path,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "peak_allocated": st.get("allocated_bytes.all.peak", 0), "peak_reserved": st.get("reserved_bytes.all.peak", 0),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "out") + "/traces")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=31)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per workload")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.child:
        child(a.child, a.steps, a.seed, a.out)
        return
    results = []
    for name in a.only.split(","):
        t0 = time.time()
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--steps", str(a.steps), "--seed", str(a.seed), "--out", a.out]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else ""
            r = json.loads(line) if line else {"workload": name, "error": p.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            r = {"workload": name, "error": "timed out after %.0f s" % a.timeout}
        r["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(r), flush=True)
        results.append(r)
    with open(os.path.join(a.out, "record.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
