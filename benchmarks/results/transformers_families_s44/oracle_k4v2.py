"""Is k4v2's logit difference quantisation-level? Decode logits with KVarNCache(k4v2) vs a DynamicCache filled with
the same cache's dequantised K/V (kvarn.KVCache.dequantize) -- i.e. exact attention over the quantised cache."""
import sys, torch, warnings
sys.argv.append("-q")
warnings.filterwarnings("ignore")
import transformers as T
from harness import build, KVarNCache, restore_attention, cache_kwargs
for name in ("llama", "qwen2", "granite", "phi3", "gpt_oss_nosink" if False else "olmo2"):
    for preset in ("k4v2_g128", "k8v8_g128"):
        m = build(name)
        seq = torch.randint(3, 200, (1, 301), generator=torch.Generator().manual_seed(1)); P = 300
        with torch.no_grad():
            exact = m(seq).logits[:, -1]
            kc = KVarNCache(m.config, preset=preset)
            m(seq[:, :P], **cache_kwargs(m, kc))
            dc = T.DynamicCache(config=m.config)
            for i, layer in enumerate(kc.layers):
                K, V = layer.caches[0].dequantize()
                K, V = torch.as_tensor(K)[None].float(), torch.as_tensor(V)[None].float()
                dc.update(K, V, i)
            kv_logits = m(seq[:, P:], **cache_kwargs(m, kc)).logits[:, -1]
            restore_attention(m.config)
            dq_logits = m(seq[:, P:], **cache_kwargs(m, dc)).logits[:, -1]
        print(f"{name} {preset}: |kvarn - exact| {(kv_logits-exact).abs().max():.3e}   |dequant-oracle - exact| "
              f"{(dq_logits-exact).abs().max():.3e}   |kvarn - dequant-oracle| {(kv_logits-dq_logits).abs().max():.3e}")
