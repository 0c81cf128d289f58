"""Two ranks through the NCCL library, far apart at both ends: rank 1 reaches the first
collective (where PyTorch creates the NCCL communicator) LATE seconds after rank 0, and rank
0 reaches destroy_process_group (ncclCommFinalize + ncclCommDestroy) LATE seconds after rank
1. Run with MSCCLPP_BOOTSTRAP_TIMEOUT below LATE: only the rendezvous timeout may bound these
waits. Prints 'late-rank check passed' per rank."""
import os, time
import torch
import torch.distributed as dist

r = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ.get("DEV", os.environ["LOCAL_RANK"])))
late = float(os.environ.get("LATE", "8"))
dist.init_process_group("nccl")
if r == 1:
    time.sleep(late)
x = torch.full((1024,), float(r + 1), device="cuda")
t = time.time()
dist.all_reduce(x)
torch.cuda.synchronize()
ok = bool((x == 3.0).all().item())
print(f"rank {r}: first all_reduce (communicator set-up) took {time.time() - t:.1f}s, ok={ok}", flush=True)
if r == 0:
    time.sleep(late)
t = time.time()
dist.destroy_process_group()
print(f"rank {r}: destroy_process_group took {time.time() - t:.1f}s", flush=True)
print(f"rank {r}: late-rank check {'passed' if ok else 'FAILED'}", flush=True)
