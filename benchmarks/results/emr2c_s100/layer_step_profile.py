"""cProfile of layer_step_ab_s26.py's loop (KVarNCache.update + kvarn attention, 30 layers, Hk 3 / D 64, 1K tokens, 1 thread,
100 steps): self time per function, the 30 largest."""
import cProfile, pathlib, pstats, sys
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from layer_step_ab_s26 import prefilled_cache, run_steps, step_inputs

g = torch.Generator().manual_seed(0)
cache = prefilled_cache(g)
steps = step_inputs(g)
pr = cProfile.Profile(); pr.enable(); run_steps(cache, steps); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
