"""Alternating A/B of two builds (processes alternate, the order flips each round); ratio new/old per
round and config, median over rounds. Usage: python ab.py ROUNDS CALLS [TOKENS]"""
import json, os, statistics, subprocess, sys
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
CALLS = sys.argv[2] if len(sys.argv) > 2 else "20"
N = sys.argv[3] if len(sys.argv) > 3 else "32768"
BUILDS = {"old": "/work/scratch/h49/site_base", "new": "/work/scratch/h49/site"}
here = os.path.dirname(os.path.abspath(__file__))


def run(build):
    env = dict(os.environ, PYTHONPATH=BUILDS[build], OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(here, "ab_worker.py"), CALLS, N], env=env, cwd=here,
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


ratios = {}
for i in range(ROUNDS):
    order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
    res = {b: run(b) for b in order}
    load = os.getloadavg()[0]
    for k in res["old"]:
        ratios.setdefault(k, []).append(res["new"][k] / res["old"][k])
        print(f"round {i} ({'/'.join(order)}) load {load:.2f}  {k:24s} old {res['old'][k]:8.3f} ms  new {res['new'][k]:8.3f} ms  new/old {res['new'][k] / res['old'][k]:.3f}", flush=True)
print("summary: new/old per round, median")
for k, v in ratios.items():
    print(f"  {k:24s} {' '.join(f'{x:.3f}' for x in v)}  median {statistics.median(v):.3f}  range {min(v):.3f}-{max(v):.3f}")
