"""OLMoE/PhiMoE show large late-step logit diffs even at P=40 (all-fp16 cache). Control: a DynamicCache that merely
rounds stored K/V to fp16 -- if it shows the same size of diff, it is MoE routing flips amplifying fp16 rounding."""
import sys, torch, warnings
sys.argv.append("-q")
warnings.filterwarnings("ignore")
import transformers as T
from harness import build, greedy, KVarNCache, restore_attention, teacher_forced
class F16Cache(T.DynamicCache):
    def update(self, k, v, i, *a, **kw):
        return super().update(k.half().float(), v.half().float(), i, *a, **kw)
for name, P in (("olmoe", 40), ("phimoe", 300), ("llama", 40)):
    m = build(name)
    ids = torch.randint(3, 200, (1, P), generator=torch.Generator().manual_seed(1))
    seq = greedy(m, ids, n=40).sequences
    with torch.no_grad(): full = m(seq).logits[:, P - 1:]
    kv = teacher_forced(m, seq, P, KVarNCache(m.config, preset="k8v8_g128")); restore_attention(m.config)
    f16 = teacher_forced(m, seq, P, F16Cache(config=m.config))
    dk = (kv - full).abs().amax(dim=(0, 2)); df = (f16 - full).abs().amax(dim=(0, 2))
    print(f"{name} P={P}: kvarn-k8v8 vs exact: max {dk[1:].max():.2e}; fp16-rounded DynamicCache vs exact: max {df[1:].max():.2e}; kvarn vs fp16-rounded: max {(kv-f16).abs().max():.2e}")
