import sys, time, os, glob, threading
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
def helper_ns():
    me = str(threading.get_native_id()); tot = 0
    for f in glob.glob("/proc/self/task/*/schedstat"):
        if f.split("/")[4] != me: tot += int(open(f).read().split()[0])
    return tot
c = kvarn.KVCache(2, 64); rng = np.random.default_rng(0)
c.append(rng.standard_normal((2, 600, 64)).astype(np.float32), rng.standard_normal((2, 600, 64)).astype(np.float32))
q = rng.standard_normal((4, 64)).astype(np.float32)
for _ in range(20): kvarn.attend(q, c, num_threads=2)
idle, b2b = [], []
for trial in range(5):
    time.sleep(0.05); a = helper_ns(); kvarn.attend(q, c, num_threads=2); time.sleep(0.05); idle.append((helper_ns() - a) / 1e3)
    for _ in range(50): kvarn.attend(q, c, num_threads=2)
    d = helper_ns(); time.sleep(0.05); b2b.append((helper_ns() - d) / 1e3)
print(sys.argv[1][-5:], "after idle", [round(x) for x in idle], "after back-to-back", [round(x) for x in b2b])
