# Copy-engine reference: cudaMemcpyAsync device-to-device on one GPU, one and two streams.
import ctypes, glob, sys, time
cands = glob.glob('/opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so*') + ['libcudart.so']
rt = None
for c in cands:
    try:
        rt = ctypes.CDLL(c); break
    except OSError:
        pass
if rt is None:
    print("no libcudart"); sys.exit(1)
def ck(r, what):
    if r != 0: raise SystemExit(f"{what}: error {r}")
S = 256 << 20
bufs = []
for _ in range(4):
    p = ctypes.c_void_p(); ck(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(S)), "cudaMalloc"); bufs.append(p)
streams = []
for _ in range(2):
    s = ctypes.c_void_p(); ck(rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "stream"); streams.append(s)
def run(nstreams, chunk, iters=10):
    n = S // chunk
    ck(rt.cudaDeviceSynchronize(), "sync")
    t0 = time.perf_counter()
    for _ in range(iters):
        for k in range(nstreams):
            for c in range(n):
                ck(rt.cudaMemcpyAsync(ctypes.c_void_p(bufs[2*k+1].value + c*chunk), ctypes.c_void_p(bufs[2*k].value + c*chunk), ctypes.c_size_t(chunk), 3, streams[k]), "memcpy")
    ck(rt.cudaDeviceSynchronize(), "sync")
    dt = (time.perf_counter() - t0) / iters
    print(f"cudaMemcpyAsync D2D {nstreams} stream(s) x 256 MiB in {chunk>>10} KiB copies: {dt*1e6:.0f} us per round, {nstreams*S/dt/1e9:.1f} GB/s total")
for ns in (1, 2):
    for ch in (S, 4 << 20, 1 << 20):
        run(ns, ch)
