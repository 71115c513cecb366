#!/usr/bin/env python3
"""GPU check of libgoep_nccl.so under PyTorch's backend="nccl".

Run the whole check (two torchrun runs, with and without the shim, then a
comparison) from the repository root on a GPU machine:

    make nccl-shim     # or: bring .devbin/libgoep_nccl.so built elsewhere
    python3 scripts/torch_shim_check.py --shim .devbin/libgoep_nccl.so [--nproc N] [--bench]

The driver starts, for each mode ("shim": LD_PRELOAD=<shim>, GOEP_NCCL_DEBUG=1;
"nccl": plain PyTorch),

    torchrun --standalone --nproc_per_node=N scripts/torch_shim_check.py --worker --out DIR/MODE

Each worker checks, against values computed on the host, in bf16, fp16 and
fp32: all_reduce (sum, max), all_gather_into_tensor, reduce_scatter_tensor,
broadcast, barrier, send/recv (rank r -> r+1); then replays a CUDA graph that
captured an all_reduce 100 times; then trains a small model with DDP for 200
steps and writes the losses. With --bench it also times all_reduce from 1 KiB
to 256 MiB. The driver compares the two runs' losses (equal, or within
1e-5 relative when more than two ranks sum in a different order), prints the
shim's per-path counts (plan / native / nccl / staged) and the timing table,
and exits 1 on any failure.

Environment: N defaults to the number of GPUs. GOEP_NCCL may name the real
libnccl.so.2 (else the shim finds PyTorch's pip wheel). NCCL_NVLS_ENABLE=0 is
set: goep never uses NVLink multicast.
"""

import argparse
import json
import os
import subprocess
import sys
import time

DTYPES = ["bfloat16", "float16", "float32"]
STEPS = 200


def worker(out_dir, bench):
    import ctypes

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl")
    failures = []

    def check(name, got, want):
        got = got.float().cpu()
        want = want.float().cpu()
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            i = tuple(bad[0].tolist()) if len(bad) else ()
            failures.append(f"rank {rank}: {name}: {len(bad)} elements differ, first at {i}: "
                            f"got {got[i].item() if i else got} want {want[i].item() if i else want}")

    n = 4099  # odd on purpose: not a multiple of any chunking
    for dname in DTYPES:
        dt = getattr(torch, dname)

        def val(r, count=n, off=0):
            # Small integers: exact in bf16 and fp16, sums exact too.
            return ((torch.arange(off, off + count, dtype=torch.float32) % 7) + r + 1).to(dt)

        x = val(rank).to(dev)
        dist.all_reduce(x)
        check(f"all_reduce sum {dname}", x, sum(val(r).float() for r in range(world)))

        x = val(rank).to(dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        check(f"all_reduce max {dname}", x, val(world - 1))

        out = torch.empty(world * n, dtype=dt, device=dev)
        dist.all_gather_into_tensor(out, val(rank).to(dev))
        check(f"all_gather_into_tensor {dname}", out, torch.cat([val(r) for r in range(world)]))

        inp = torch.cat([val(rank, n, p * n) for p in range(world)]).to(dev)
        out = torch.empty(n, dtype=dt, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        check(f"reduce_scatter_tensor {dname}", out, sum(val(r, n, rank * n).float() for r in range(world)))

        root = world - 1
        x = (val(rank) if rank == root else torch.zeros(n, dtype=dt)).to(dev)
        dist.broadcast(x, src=root)
        check(f"broadcast {dname}", x, val(root))

        dist.barrier()

        if world > 1:
            to, frm = (rank + 1) % world, (rank - 1) % world
            got = torch.zeros(n, dtype=dt, device=dev)
            if rank % 2 == 0:
                dist.send(val(rank).to(dev), to)
                dist.recv(got, frm)
            else:
                dist.recv(got, frm)
                dist.send(val(rank).to(dev), to)
            check(f"send/recv {dname}", got, val(frm))
    torch.cuda.synchronize()

    # A CUDA graph holding one all_reduce, replayed 100 times: each replay
    # multiplies by world (every rank holds the same values).
    g_in = torch.ones(1 << 16, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        for _ in range(3):
            dist.all_reduce(g_in)
    torch.cuda.current_stream().wait_stream(side)
    g_in.fill_(1.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(g_in)
        g_in.div_(world)
    for i in range(100):
        g_in.fill_(float(i + rank))  # the ranks differ; the mean is known
        graph.replay()
        torch.cuda.synchronize()
        want = sum(float(i + r) for r in range(world)) / world
        if not torch.all(g_in == want).item():
            failures.append(f"rank {rank}: graph replay {i}: got {g_in[0].item()} want {want}")
            break

    # DDP: a small MLP, the same data on every run.
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for _ in range(STEPS):
        xb = torch.randn(32, 64, generator=gen).to(dev)
        yb = torch.randn(32, 16, generator=gen).to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    timing = {}
    if bench:
        for shift in range(10, 29, 2):  # 1 KiB .. 256 MiB
            nbytes = 1 << shift
            t = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=dev)
            for _ in range(5):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            iters = 50 if nbytes <= (16 << 20) else 10
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            timing[nbytes] = (time.perf_counter() - start) / iters * 1e6

    # The shim's counts, when it is loaded.
    try:
        ctypes.CDLL(None).goepNcclPrintCounts()
    except (AttributeError, OSError):
        pass
    dist.barrier()
    dist.destroy_process_group()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"failures": failures, "losses": losses, "timing_us": timing}, f)
    for line in failures:
        print("FAIL", line, flush=True)
    return 1 if failures else 0


def run_mode(mode, args, out):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    if mode == "shim":
        env["LD_PRELOAD"] = os.path.abspath(args.shim)
        env["GOEP_NCCL_DEBUG"] = "1"
    else:
        env.pop("LD_PRELOAD", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.abspath(__file__), "--worker", "--out", os.path.join(out, mode)]
    if args.bench:
        cmd.append("--bench")
    print(f"=== {mode}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.timeout)
    print(proc.stdout, flush=True)
    results = []
    for r in range(args.nproc):
        path = os.path.join(out, mode, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    return proc.returncode, proc.stdout, results


def driver(args):
    import torch

    if args.nproc is None:
        args.nproc = torch.cuda.device_count()
    if args.nproc < 1:
        print("no GPU")
        return 1
    if not os.path.exists(args.shim):
        print(f"{args.shim} not found: run `make nccl-shim` first")
        return 1
    out = args.out or os.path.join(os.getcwd(), "out", "torch_shim")
    failed = []
    runs = {}
    for mode in ("shim", "nccl"):
        rc, log, results = run_mode(mode, args, out)
        runs[mode] = results
        if rc != 0 or len(results) != args.nproc:
            failed.append(f"{mode}: torchrun exit {rc}, {len(results)} of {args.nproc} ranks wrote results")
        for res in results:
            failed += [f"{mode}: {x}" for x in res["failures"]]
        if mode == "shim":
            counts = [ln for ln in log.splitlines() if "goep-nccl: rank" in ln]
            print("per-path counts (plan / native / nccl / staged):")
            print("\n".join(counts) if counts else "  (none printed: was the shim loaded?)")
            if not counts:
                failed.append("shim: no per-path counts printed: LD_PRELOAD did not take effect")
    if len(runs["shim"]) == args.nproc and len(runs["nccl"]) == args.nproc:
        a, b = runs["shim"][0]["losses"], runs["nccl"][0]["losses"]
        worst = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf"))
        exact = a == b
        print(f"DDP {STEPS} steps: losses {'identical' if exact else f'max relative difference {worst:.3g}'}"
              f" (first {a[0]:.6f}, last shim {a[-1]:.6f} nccl {b[-1]:.6f})")
        if len(a) != STEPS or len(b) != STEPS or (not exact and (args.nproc <= 2 or worst > 1e-5)):
            failed.append("DDP losses with the shim differ from NCCL's")
        if args.bench:
            print(f"{'bytes':>12} {'shim us':>10} {'nccl us':>10}  ratio")
            for nbytes in sorted(runs["shim"][0]["timing_us"], key=int):
                s = max(r["timing_us"][nbytes] for r in runs["shim"])
                n = max(r["timing_us"][nbytes] for r in runs["nccl"])
                flag = "  SLOWER" if s > n * 1.05 else ""
                print(f"{int(nbytes):>12} {s:>10.1f} {n:>10.1f}  {s / n:5.2f}{flag}")
    for line in failed:
        print("FAIL", line)
    print("PASS" if not failed else f"{len(failed)} failures")
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shim", default=".devbin/libgoep_nccl.so", help="path of libgoep_nccl.so")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: the GPUs here)")
    p.add_argument("--bench", action="store_true", help="also time all_reduce, 1 KiB to 256 MiB")
    p.add_argument("--out", default=None, help="results directory (default ./out/torch_shim)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per torchrun")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.out, args.bench)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
