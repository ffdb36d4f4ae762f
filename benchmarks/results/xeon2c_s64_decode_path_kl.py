"""Twenty-fourth session, the 2-core Xeon (AVX-512): tests/test_integration_transformers.py's
test_decode_path_agrees_with_pseudo_decode failed its KL-to-fp32 bound (cache vs its torch simulation) there. Its
numbers per ISA and score mode, the same data as the test: KL(fp32 || cache), KL(fp32 || sim), their relative gap and
KL(sim || cache). Run: python xeon2c_s64_decode_path_kl.py avx512:int16 avx2:int16 avx512:float scalar:float avx512:int8
(output: xeon2c_s64_decode_path_kl.log)."""
import sys, torch, kvarn
from kvarn import eval as kev
from kvarn.integrations import assets
torch.manual_seed(0)
model, tok = assets.load_model("smollm2-135m")
ids = assets.verne_token_ids(tok, 400)
P, S, preset, sink = 200, 124, "k4v2_g64", 64
seq = ids[: P + S]
m = [mm for mm in kev.build_methods(64, presets=(preset,), baselines=False) if mm.preset and mm.preset.name == preset][0]
ref = kev.forward_logits(model, seq, kev.PseudoDecode(None, sink, m.group))[P:]
ref_lp = torch.log_softmax(ref[:-1].double(), -1).float()
tg = torch.tensor(seq[P + 1:])
for q in ["fill", "next"]:
    sim = kev.stepwise_logits(model, seq, P, S, kev._sim_cache_class()(model.config, m, sink, q))
    sim_lp = torch.log_softmax(sim[:-1].double(), -1).float()
    kl_sim = kev.compare_logits(ref_lp, sim[:-1], tg)["kl"]
    for mode in sys.argv[1:]:
        isa, sm = mode.split(":")
        kvarn.set_isa(isa) if hasattr(kvarn, "set_isa") else None
        kvarn.set_score_mode(sm)
        dec, cache = kev.decode_path_logits(model, seq, P, S, preset, sink, q)
        kl_cache = kev.compare_logits(ref_lp, dec[:-1], tg)["kl"]
        kl_sc = kev.compare_logits(sim_lp, dec[:-1], tg)["kl"]
        print(f"{q} {kvarn.active_isa()}:{kvarn.score_mode()} KL cache {kl_cache:.6f} sim {kl_sim:.6f} "
              f"rel {(kl_cache-kl_sim)/kl_sim:+.4f}  KL(sim||cache) {kl_sc:.2e}", flush=True)
