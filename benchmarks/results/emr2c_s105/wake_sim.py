# Sixty-fifth session: the pool's wake choice (native/cpu/api.cpp, WakeChoice) re-written in Python, against a
# variant whose exploring gap is drawn at random in [1, 2) x the rule's, over periodic per-call costs (a model's
# layers repeating with period P, one phase much cheaper or dearer to run alone): does the every-N-th exploration
# alias with such a period to a wrong choice? Mean time per call against the best fixed way (wake_sim.log).
import numpy as np
def run(alone, woken, jitter):
    W, warm, kmin, kmax, cost = 8, 3, 16, 4096, 1/64
    s = {0: [], 1: []}; runs = [0, 0]; since = 0; jit = 1.0; x = 0x9E3779B9; out = []
    def est(w):
        v = sorted(s[w][-W:]); n = len(v); return v[n//2] if n % 2 else 0.5*(v[n//2-1]+v[n//2])
    for i in range(len(alone)):
        if runs[0] < warm or runs[1] < warm:
            wake = runs[1] <= runs[0]
        else:
            a, b = est(0), est(1); fw = b < a
            slower_by = (a / b if fw else b / a) - 1
            base = min(kmax, max(kmin, slower_by / cost))
            gap = min(kmax, base * jit) if jitter else base
            since += 1
            if since < gap: wake = fw
            else:
                since = 0; wake = not fw
                if jitter:
                    x ^= (x << 13) & 0xffffffff; x ^= x >> 17; x ^= (x << 5) & 0xffffffff
                    jit = 1.0 + (x >> 8) / 2**24
        wake = bool(wake); t = woken[i] if wake else alone[i]
        s[wake].append(t); runs[wake] += 1; out.append(t)
    return np.array(out)
n = 4000
for P in (16, 32, 30, 48, 64):
    for phase in range(P):
        alone = np.where(np.arange(n) % P == phase, 0.5, 1.5); woken = np.ones(n)
        o = run(alone, woken, False).sum() / n; j = run(alone, woken, True).sum() / n
        if phase < 3 or o > 1.05: print(P, phase, f"old {o:.3f} new {j:.3f}")
print("harsher")
worst = (0, None)
for P in (16, 32, 30, 48, 64, 128):
    for lo, hi in ((0.1, 1.5), (0.3, 2.0), (0.5, 1.2)):
        for phase in range(P):
            alone = np.where(np.arange(n) % P == phase, lo, hi); woken = np.ones(n)
            o = run(alone, woken, False).sum() / n
            best = min(alone.mean(), 1.0)
            if o / best > worst[0]: worst = (o / best, (P, lo, hi, phase, o, run(alone, woken, True).sum() / n / best))
print(worst)
