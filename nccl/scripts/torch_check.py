#!/usr/bin/env python3
"""PyTorch (backend nccl) on libmscclpp_nccl.so: one rank of `torch.distributed.run`.

    python -m torch.distributed.run --nproc_per_node 2 torch_check.py --out DIR --mode plain|ours

Checks all_reduce (float, half, bfloat16 sums; max; int32), all_gather_into_tensor,
reduce_scatter_tensor, broadcast, send/recv, all_to_all_single, reduce, gather, scatter,
barrier, an all_reduce
captured into a CUDA graph and replayed, and a few DistributedDataParallel steps whose
parameters are saved to DIR/ddp_<mode>.pt (torch_check.sh compares the two modes). Mode
"ours" also checks that libmscclpp_nccl.so is mapped into the process. With
TORCH_CHECK_SPLIT=1 the default group is bound to the device (set up at once) and a group
split from it (`split_group`: ncclCommSplit) runs an all_reduce. Under
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True a 48 MiB tensor lying across the
allocator's segments is all-reduced. Exit status 1 on any failed check.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"[rank {dist.get_rank()}] FAIL {what}", file=sys.stderr, flush=True)


def close(a, b, tol=0.0):
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["plain", "ours"], required=True)
    args = ap.parse_args()
    # TORCH_CHECK_DEVICE puts every rank on one GPU (a one-GPU machine). The real NCCL
    # refuses two ranks on one GPU of one host: TORCH_CHECK_HOST_PER_RANK gives each rank a
    # host id of its own (NCCL_HOSTID, read at its first set-up), so it joins them over
    # sockets.
    local = int(os.environ.get("TORCH_CHECK_DEVICE", os.environ["LOCAL_RANK"]))
    if os.environ.get("TORCH_CHECK_HOST_PER_RANK"):
        os.environ["NCCL_HOSTID"] = "torch-check-rank-" + os.environ["RANK"]
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    split = bool(os.environ.get("TORCH_CHECK_SPLIT"))
    dist.init_process_group("nccl", device_id=dev if split else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    total = world * (world + 1) / 2

    if args.mode == "ours":
        with open("/proc/self/maps") as f:
            check("libmscclpp_nccl.so" in f.read(), "libmscclpp_nccl.so is loaded (LD_PRELOAD)")

    # all_reduce: sums, max, int32, avg (all native)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 1000, 1 << 20, (8 << 20) + 3):
            x = torch.full((n,), float(rank + 1), dtype=dtype, device=dev)
            dist.all_reduce(x)
            check(close(x, torch.full_like(x, total)), f"all_reduce sum {dtype} n={n}")
    x = torch.arange(4096, device=dev, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    check(close(x, torch.arange(4096, device=dev, dtype=torch.float32) * world), "all_reduce max")
    x = torch.full((777,), rank + 1, dtype=torch.int32, device=dev)
    dist.all_reduce(x)
    check(bool((x == int(total)).all()), "all_reduce int32 sum")
    x = torch.full((4096,), float(rank + 1), device=dev)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check(close(x, torch.full_like(x, total / world), 1e-6), "all_reduce avg")

    # all_gather_into_tensor (native), odd sizes and bytes
    for dtype, n in ((torch.float32, 1000), (torch.bfloat16, 4097), (torch.uint8, 4096), (torch.uint8, 33)):
        inp = torch.full((n,), rank + 1, dtype=dtype, device=dev)
        out = torch.empty(world * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, inp)
        want = torch.cat([torch.full((n,), r + 1, dtype=dtype, device=dev) for r in range(world)])
        check(bool((out == want).all()), f"all_gather_into_tensor {dtype} n={n}")

    # reduce_scatter_tensor (native)
    n = 1024
    inp = torch.arange(world * n, dtype=torch.float32, device=dev) + rank
    out = torch.empty(n, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    want = (torch.arange(world * n, dtype=torch.float32, device=dev) * world + sum(range(world)))[rank * n:(rank + 1) * n]
    check(close(out, want), "reduce_scatter_tensor")

    # broadcast (native)
    x = torch.full((5000,), float(rank + 7), device=dev)
    dist.broadcast(x, src=0)
    check(close(x, torch.full_like(x, 7.0)), "broadcast")

    # send/recv (native)
    if world >= 2:
        if rank == 0:
            dist.send(torch.arange(100, dtype=torch.float32, device=dev), dst=1)
        elif rank == 1:
            y = torch.zeros(100, dtype=torch.float32, device=dev)
            dist.recv(y, src=0)
            check(close(y, torch.arange(100, dtype=torch.float32, device=dev)), "send/recv")

    # all_to_all_single (native: ncclAlltoAll, or sends/receives in a group)
    n = 256
    inp = torch.arange(world * n, dtype=torch.float32, device=dev) + 1000 * rank
    out = torch.empty(world * n, dtype=torch.float32, device=dev)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32, device=dev) + 1000 * r for r in range(world)])
    check(close(out, want), "all_to_all_single")

    # reduce to the last rank (native: ncclReduce); the others' tensors keep their values
    x = torch.full((3000,), float(rank + 1), device=dev)
    dist.reduce(x, dst=world - 1)
    want = float(sum(r + 1 for r in range(world))) if rank == world - 1 else float(rank + 1)
    check(close(x, torch.full_like(x, want)), "reduce")

    # gather to rank 0 and scatter from it (PyTorch spells both as grouped sends/receives)
    n = 777
    inp = torch.arange(n, dtype=torch.float32, device=dev) + 100 * rank
    outs = [torch.empty(n, dtype=torch.float32, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(inp, gather_list=outs, dst=0)
    if rank == 0:
        check(all(close(outs[r], torch.arange(n, dtype=torch.float32, device=dev) + 100 * r)
                  for r in range(world)), "gather")
    pieces = [torch.arange(n, dtype=torch.float32, device=dev) - r for r in range(world)] if rank == 0 else None
    out = torch.empty(n, dtype=torch.float32, device=dev)
    dist.scatter(out, scatter_list=pieces, src=0)
    check(close(out, torch.arange(n, dtype=torch.float32, device=dev) - rank), "scatter")

    dist.barrier()

    # all_reduce captured into a CUDA graph, replayed with new inputs
    static = torch.zeros(1 << 16, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(static)
    for it in range(3):
        static.fill_(float(rank + 1 + it))
        g.replay()
        torch.cuda.synchronize()
        want = sum(r + 1 + it for r in range(world))
        check(close(static, torch.full_like(static, float(want))), f"graph replay {it}")

    # With PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
    # the allocator maps 20 MiB physical allocations back to back into one reserved range,
    # and a large tensor (a DDP bucket) lies across them. Checks that such a tensor is
    # all-reduced (our library once refused it as going beyond its allocation), after making
    # sure, with the driver's own answer, that it does cross one.
    alloc_conf = (os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," +
                  os.environ.get("PYTORCH_ALLOC_CONF", "")).lower().replace(" ", "")
    if "expandable_segments:true" in alloc_conf:
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        n = 12 << 20
        pad = torch.empty(5 << 20, dtype=torch.uint8, device=dev)
        x = torch.arange(n, dtype=torch.float32, device=dev) % 251 + rank
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(x.data_ptr()))
        crosses = rc == 0 and base.value + size.value < x.data_ptr() + 4 * n
        print(f"[rank {rank}] 48 MiB tensor at {x.data_ptr():#x}: its allocation is {size.value} "
              f"bytes at {base.value:#x} (rc {rc}), so it crosses into another: {crosses}", flush=True)
        check(crosses, "the 48 MiB tensor lies across expandable segments")
        dist.all_reduce(x)
        want = (torch.arange(n, dtype=torch.float32, device=dev) % 251) * world + sum(range(world))
        check(close(x, want), "all_reduce of a tensor across expandable segments")
        del pad

    # DistributedDataParallel: the same model, data and steps in both modes
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    for _ in range(5):
        xb = torch.randn(64, 256, generator=gen).to(dev)
        yb = torch.randint(0, 10, (64,), generator=gen).to(dev)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.step()
    torch.cuda.synchronize()
    params = [p.detach().cpu() for p in model.parameters()]
    gathered = [torch.cat([p.flatten() for p in params]).to(dev)]
    # every rank holds the same parameters after DDP steps
    other = torch.empty_like(gathered[0])
    other.copy_(gathered[0])
    dist.broadcast(other, src=0)
    check(close(other, gathered[0]), "DDP parameters equal on every rank")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(params, os.path.join(args.out, f"ddp_{args.mode}.pt"))

    if split:
        # ncclCommSplit: PyTorch splits a group bound to a device.
        try:
            sub = dist.split_group(split_ranks=[list(range(world))])
            x = torch.full((1000,), float(rank + 1), device=dev)
            dist.all_reduce(x, group=sub)
            check(close(x, torch.full_like(x, total)), "all_reduce on a split group")
            dist.destroy_process_group(sub)
        except Exception as e:  # a failed check, not a crash: the rest still reports
            check(False, f"split_group: {e!r}")

    # The result before the teardown, so that a hang there (seen once with the real NCCL on
    # 2x H200, after every check had passed) still shows what was checked; the run still
    # fails on its timeout.
    print(f"[rank {rank}] torch_check {args.mode}: {len(failures)} failure(s)", flush=True)
    dist.barrier(device_ids=[local])
    dist.destroy_process_group()
    print(f"[rank {rank}] torch_check {args.mode}: teardown done", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
