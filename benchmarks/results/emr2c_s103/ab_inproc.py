"""In-process A/B of host-path changes: the old definitions (from a git revision's source, exec'd into the
same modules) against the installed ones, alternating step by step over layer_loop's 30 SmolLM2-shape
layers at 1K, one kvarn thread. Usage: ab_inproc.py REV 'module:qualname,...' [steps]"""
import ast, os, statistics, subprocess, sys, textwrap, time
import numpy as np
import torch
import kvarn
from kvarn import _ops
import kvarn.cache
import kvarn.integrations.transformers as T

rev, specs = sys.argv[1], sys.argv[2].split(",")
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 400
files = {"_ops": ("src/kvarn/_ops.py", _ops), "T": ("src/kvarn/integrations/transformers.py", T),
         "cache": ("src/kvarn/cache.py", kvarn.cache)}

def old_def(mod, qual):
    path, module = files[mod]
    src = subprocess.run(["git", "-C", "/work/main", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
    tree = ast.parse(src)
    parts = qual.split(".")
    body = tree.body
    for p in parts[:-1]:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == p).body
    node = next(n for n in body if isinstance(n, (ast.FunctionDef,)) and n.name == parts[-1])
    code = textwrap.dedent(ast.get_source_segment(src, node))
    ns = vars(module)  # live globals, so that the old code calls whatever use() swapped in
    saved = ns.get(parts[-1])
    exec(compile(code, f"<{rev}:{path}>", "exec"), ns)
    old = ns[parts[-1]]
    if saved is not None:
        ns[parts[-1]] = saved
    return old

swaps = []
for spec in specs:
    mod, qual = spec.split(":")
    owner = files[mod][1]
    parts = qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    new, old = getattr(owner, parts[-1]), old_def(mod, qual)
    swaps.append((owner, parts[-1], new, old))
    for other in (T, kvarn.cache):  # names imported from _ops
        if other is not owner and getattr(other, parts[-1], None) is new:
            swaps.append((other, parts[-1], new, old))

def use(which):
    for owner, name, new, old in swaps:
        setattr(owner, name, new if which == "new" else old)

kvarn.set_num_threads(int(os.environ.get("KT", "1")))
ctx = int(os.environ.get("CTX", "1024"))
L, Hq, Hk, D = 30, 9, 3, 64
rng = np.random.default_rng(0)
layers = [T.KVarNLayer() for _ in range(L)]
with torch.inference_mode():
    for layer in layers:
        k = torch.from_numpy(rng.standard_normal((1, Hk, ctx, D), dtype=np.float32))
        layer.update(k, k.clone())
        layer.store_prefill(None)
ks = [torch.from_numpy(rng.standard_normal((1, Hk, 1, D), dtype=np.float32)) for _ in range(8)]
qs = [torch.from_numpy(rng.standard_normal((1, Hq, 1, D), dtype=np.float32)) for _ in range(8)]
times = {"old": [], "new": []}
outs = {}
with torch.inference_mode():
    for s in range(steps):
        which = ("old", "new")[(s // 2 + s) % 2]  # ABBA-ish
        use(which)
        t = time.perf_counter()
        for layer in layers:
            layer.update(ks[s % 8], ks[(s + 1) % 8])
            o = layer.attend_pending(qs[s % 8], None, 0.125)
        times[which].append((time.perf_counter() - t) / L * 1e6)
        if (s + 1) % 64 == 0:
            for layer in layers:
                layer.crop(-64)
use("new")
o_med, n_med = statistics.median(times["old"]), statistics.median(times["new"])
q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]
print(f"{rev} -> installed, {','.join(specs)}: per layer old {o_med:.1f} us, new {n_med:.1f} us, "
      f"new/old {n_med / o_med:.3f} (quartiles old {q(times['old'], .25):.1f}/{q(times['old'], .75):.1f}, "
      f"new {q(times['new'], .25):.1f}/{q(times['new'], .75):.1f})")
