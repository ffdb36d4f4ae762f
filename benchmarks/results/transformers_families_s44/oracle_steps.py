"""Per-step oracle: at every teacher-forced decode step, kvarn's logits vs exact attention over the same cache's
dequantised K/V (a DynamicCache rebuilt from kvarn.KVCache.dequantize()). Shows whether big diffs (PhiMoE) are
quantisation (+ MoE routing) or an integration error."""
import sys, torch, warnings
sys.argv.append("-q")
warnings.filterwarnings("ignore")
import transformers as T
from harness import build, greedy, KVarNCache, restore_attention, cache_kwargs
for name, P, preset in (("phimoe", 300, "k8v8_g128"), ("granitemoe", 300, "k8v8_g128"), ("llama", 300, "k4v2_g128")):
    m = build(name)
    ids = torch.randint(3, 200, (1, P), generator=torch.Generator().manual_seed(1))
    seq = greedy(m, ids, n=40).sequences
    with torch.no_grad():
        full = m(seq).logits[0]
        kc = KVarNCache(m.config, preset=preset)
        m(seq[:, :P], **cache_kwargs(m, kc))
        worst_exact = worst_oracle = 0.0
        for t in range(P, seq.shape[1]):
            dc = T.DynamicCache(config=m.config)
            for i, layer in enumerate(kc.layers):
                K, V = layer.caches[0].dequantize()
                dc.update(torch.as_tensor(K)[None].float(), torch.as_tensor(V)[None].float(), i)
            o_oracle = m(seq[:, t:t+1], **cache_kwargs(m, dc)).logits[0, -1]
            o_kv = m(seq[:, t:t+1], **cache_kwargs(m, kc)).logits[0, -1]
            worst_exact = max(worst_exact, (o_kv - full[t]).abs().max().item())
            worst_oracle = max(worst_oracle, (o_kv - o_oracle).abs().max().item())
        restore_attention(m.config)
    print(f"{name} P={P} {preset}: over 40 steps max|kvarn - exact| {worst_exact:.2e}; max|kvarn - dequantised-cache oracle| {worst_oracle:.2e}")
