#!/usr/bin/env python3
"""PyTorch's parallelisms on libmscclpp_nccl.so: one rank of `torch.distributed.run`.

    python -m torch.distributed.run --nproc_per_node 2 torch_parallel.py \
        [--device cuda|cpu] [--backend nccl|gloo] [--checks fsdp,fsdp-bf16,ddp-compile,tp,pp]

(--device cpu --backend gloo checks the script itself, without a GPU.)

Each check trains the same small MLP (fixed seed, SGD, STEPS steps) distributed and compares
its full parameters with a single-process run of the same model on the full batch on this
rank's device:
  fsdp         FSDP2, fully_shard on each Linear and on the root, fp64, each rank its shard of
               the batch: max |param - reference| <= 1e-9.
  fsdp-bf16    the same with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
               and fp32 parameters, against the fp32 reference: the distributed update
               (final - initial parameters) differs from the reference's by at most
               MP_TOL of the reference update's norm (see MP_TOL).
  ddp-compile  DistributedDataParallel around torch.compile(model), fp64, each rank its shard.
  tp           tensor parallelism: parallelize_module with ColwiseParallel on each block's fc1
               and RowwiseParallel on its fc2, fp64, the full batch on every rank.
  pp           a pipeline (torch.distributed.pipelining): one stage (block) per rank,
               PipelineStage + ScheduleGPipe over MICROBATCHES microbatches, fp64; each rank
               compares its stage's parameters.
The loss is the mean over the batch, so the mean of the ranks' gradients on equal shards is
the full batch's gradient. Prints a PASS/FAIL line per check and rank, then
"torch_parallel: N failure(s)"; exit status 1 on any failure. TORCH_CHECK_DEVICE puts every
rank on that GPU (a one-GPU machine, under MPS). TORCH_PARALLEL_BREAK=X multiplies the last
rank's loss by 1+X, so its part of every gradient reduction is wrong by that factor: every
check must then FAIL (1e-6 for the fp64 checks, -1 drops the rank's part for fsdp-bf16 too).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

CHECKS = ("fsdp", "fsdp-bf16", "ddp-compile", "tp", "pp")
STEPS, LR, BATCH, MICROBATCHES = 6, 0.1, 24, 4
D_IN, D_HIDDEN = 16, 48  # divisible by 2, 3 and 4 ranks (batch shards, TP's shards)
FP64_TOL = 1e-9
# fsdp-bf16: the forward and backward run in bfloat16 (8 significant bits: each rounding is
# off by up to 2^-9 = 2e-3, and the parameters, inputs and activations are all rounded),
# the reduction and the update in fp32. The distributed update then differs from the fp32
# reference's by 1e-2 to 2e-2 of its norm (measured on CPU with gloo: 1.9e-2 with 2 ranks,
# 1.3e-2 with 3). A reduction that drops one rank's gradients is off by 0.6 (2 ranks), one
# that counts them twice by about as much.
MP_TOL = 5e-2

failures = []
check_started = time.monotonic()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(D_IN, D_HIDDEN)
        self.fc2 = torch.nn.Linear(D_HIDDEN, D_IN)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def make_model(dtype, dev):
    """One MLP block per rank (a pipeline stage each), the same on every rank."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(*[MLP() for _ in range(dist.get_world_size())]).to(dev, dtype)


def make_batches(dtype, dev):
    """STEPS full batches (input, target), the same on every rank."""
    gen = torch.Generator().manual_seed(99)
    return [(torch.randn(BATCH, D_IN, generator=gen, dtype=dtype).to(dev),
             torch.randn(BATCH, D_IN, generator=gen, dtype=dtype).to(dev)) for _ in range(STEPS)]


def shard(t):
    """This rank's part of a full batch."""
    return t.chunk(dist.get_world_size())[dist.get_rank()]


def loss_fn(out, y):
    """Mean squared error; the last rank's is off by TORCH_PARALLEL_BREAK (0: none)."""
    loss = F.mse_loss(out.to(y.dtype), y)
    if dist.get_rank() == dist.get_world_size() - 1:
        loss = loss * (1 + float(os.environ.get("TORCH_PARALLEL_BREAK", "0")))
    return loss


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def reference(dtype, dev):
    """The single-process run: the full batch, no process group involved."""
    model = make_model(dtype, dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in make_batches(dtype, dev):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return full_params(model)


def full_params(module):
    """Each parameter whole (a DTensor's shards gathered), detached, by name."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in module.named_parameters()}


def say(msg):
    """One line, in one write: the ranks share stdout."""
    sys.stdout.write(f"[rank {dist.get_rank()}] {msg}\n")
    sys.stdout.flush()


def report(name, ok, what):
    took = time.monotonic() - check_started
    say(f"{'PASS' if ok else 'FAIL'} {name}: {what} [{took:.1f} s]")
    if not ok:
        failures.append(name)


def compare(name, got, want):
    """fp64: the largest difference of any parameter from the reference, at most FP64_TOL."""
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    diff = max((got[k] - want[k]).abs().max().item() for k in want)
    report(name, diff <= FP64_TOL, f"max |param - reference| = {diff:.3e} (tolerance {FP64_TOL:g})")


def check_fsdp(dev, mesh):
    model = make_model(torch.float64, dev)
    for block in model:
        fully_shard(block.fc1, mesh=mesh)
        fully_shard(block.fc2, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, [(shard(x), shard(y)) for x, y in make_batches(torch.float64, dev)])
    compare("fsdp", full_params(model), reference(torch.float64, dev))


def check_fsdp_bf16(dev, mesh, backend):
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = make_model(torch.float32, dev)
    initial = full_params(model)
    for block in model:
        fully_shard(block.fc1, mesh=mesh, mp_policy=policy)
        fully_shard(block.fc2, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if backend == "gloo":  # gloo has no ReduceOp.AVG: sum, then divide
        model.set_force_sum_reduction_for_comms(True)
    train(model, [(shard(x), shard(y)) for x, y in make_batches(torch.float32, dev)])
    got, want = full_params(model), reference(torch.float32, dev)
    err = torch.cat([(got[k] - want[k]).flatten() for k in want])
    update = torch.cat([(want[k] - initial[k]).flatten() for k in want])
    rel = (err.norm() / update.norm()).item()
    report("fsdp-bf16", rel <= MP_TOL,
           f"|update - reference update| / |reference update| = {rel:.3e} (tolerance {MP_TOL:g}; "
           f"max |param - reference| = {err.abs().max().item():.3e})")


def check_ddp_compile(dev):
    model = make_model(torch.float64, dev)
    ddp = torch.nn.parallel.DistributedDataParallel(
        torch.compile(model), device_ids=[dev.index] if dev.type == "cuda" else None)
    train(ddp, [(shard(x), shard(y)) for x, y in make_batches(torch.float64, dev)])
    compare("ddp-compile", full_params(model), reference(torch.float64, dev))


def check_tp(dev, mesh):
    model = make_model(torch.float64, dev)
    plan = {}
    for i in range(len(model)):
        plan[f"{i}.fc1"] = ColwiseParallel()
        plan[f"{i}.fc2"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    train(model, make_batches(torch.float64, dev))
    compare("tp", full_params(model), reference(torch.float64, dev))


def check_pp(dev):
    rank, world = dist.get_rank(), dist.get_world_size()
    block = make_model(torch.float64, dev)[rank]
    stage = PipelineStage(block, rank, world, dev)
    # loss_fn is each microbatch's mean; the schedule divides the gradients by MICROBATCHES
    # (scale_grads), so they are the full batch's mean's.
    schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=loss_fn, scale_grads=True)
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    for x, y in make_batches(torch.float64, dev):
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
    want = {k[len(f"{rank}."):]: v for k, v in reference(torch.float64, dev).items()
            if k.startswith(f"{rank}.")}
    compare("pp", full_params(block), want)


def main():
    global check_started
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--checks", default=",".join(CHECKS))
    args = ap.parse_args()
    checks = args.checks.split(",")
    unknown = set(checks) - set(CHECKS)
    if unknown:
        ap.error(f"unknown checks {sorted(unknown)} (of {', '.join(CHECKS)})")
    if args.device == "cuda":
        # TORCH_CHECK_DEVICE puts every rank on one GPU (a one-GPU machine, under MPS).
        local = int(os.environ.get("TORCH_CHECK_DEVICE", os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(args.backend)

    # After set_device: the mesh keeps this rank's device (it picks LOCAL_RANK's only when
    # none is set), and a 1-D mesh of every rank uses the default group.
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    runs = {
        "fsdp": lambda: check_fsdp(dev, mesh),
        "fsdp-bf16": lambda: check_fsdp_bf16(dev, mesh, args.backend),
        "ddp-compile": lambda: check_ddp_compile(dev),
        "tp": lambda: check_tp(dev, mesh),
        "pp": lambda: check_pp(dev),
    }
    for name in checks:
        check_started = time.monotonic()
        try:
            runs[name]()
        except Exception as e:  # a failed check, not a crash: the rest still reports
            report(name, False, f"{e!r}")
        if dev.type == "cuda":
            torch.cuda.synchronize()
            dist.barrier(device_ids=[dev.index])
        else:
            dist.barrier()
    # The result before the teardown, so that a hang there still shows what was checked.
    say(f"torch_parallel: {len(failures)} failure(s)")
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
