"""Is the interleaved block timing order-dependent (GPU power state carried from one program's batch to the next)?"""
import json, sys, time, statistics
sys.argv = [sys.argv[0], sys.argv[1], "plain_cudnn,ours,ours_mxfp4,ours_linear_plain"]
exec(open(__file__.replace("order_probe.py", "block_profile.py")).read().split("times = B.timed_together")[0])
order = ["ours", "plain_cudnn", "ours_mxfp4", "ours#2", "ours_linear_plain", "plain_cudnn#2", "ours#3", "ours_linear_plain#2"]
fns = {n: compiled[n.split("#")[0]] for n in order}

def timed(fns, settle, batches=9, calls=3):
    for fn in fns.values(): jax.block_until_ready(fn(args))
    samples = {n: [] for n in fns}
    for _ in range(batches):
        for n, fn in fns.items():
            for _ in range(settle): jax.block_until_ready(fn(args))
            start = time.perf_counter()
            for _ in range(calls): out = fn(args)
            jax.block_until_ready(out)
            samples[n].append((time.perf_counter() - start) / calls)
    return {n: statistics.median(v) * 1e3 for n, v in samples.items()}

res = {}
for settle in (0, 1, 3):
    t = timed(fns, settle)
    res[f"settle{settle}"] = t
    print(f"settle {settle}: " + ", ".join(f"{n} {v:.2f}" for n, v in t.items()), flush=True)
json.dump(res, open(f"{sys.argv[1]}/order_probe.json", "w"), indent=1)
