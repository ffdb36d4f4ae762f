"""Harness: tiny random decoder-only model, greedy generate with DynamicCache vs KVarNCache.

Usage: PYTHONPATH=/work/scratch/site_s43 python harness.py NAME [NAME...]
"""
import sys, time, traceback, warnings
import torch
import transformers
import kvarn
from kvarn.integrations.transformers import KVarNCache, restore_attention, cache_kwargs

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
kvarn.set_num_threads(1)

C = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, head_dim=16, vocab_size=200, initializer_range=0.15,
         max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=None)
T = transformers
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "mistral_sw": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {}),
    "gemma2_nocap": ("Gemma2Config", "Gemma2ForCausalLM", {"attn_logit_softcapping": None, "final_logit_softcapping": None}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 6}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"__drop__": ["head_dim"], "new_decoder_architecture": True, "num_kv_heads": 2}),
    "falcon_alibi": ("FalconConfig", "FalconForCausalLM", {"__drop__": ["head_dim"], "new_decoder_architecture": True, "num_kv_heads": 2, "alibi": True}),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "glm": ("GlmConfig", "GlmForCausalLM", {}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 2048}),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", {"num_layers": 2, "num_heads": 4, "attention_types": [[["global", "local"], 1]], "window_size": 64}),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 2048}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_layer": 2, "n_head": 4}),
    "mpt": ("MptConfig", "MptForCausalLM", {"d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 2048}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 128, "word_embed_proj_dim": 64}),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 2048}),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", {}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32, "head_dim": 16}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {"q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 2, "n_group": 1, "topk_group": 1}),
    "deepseek_v3_samedim": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {"q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 2, "n_group": 1, "topk_group": 1}),
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4, "num_kv_shared_layers": 2, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"], "laurel_rank": 8, "altup_num_inputs": 2, "hidden_size_per_layer_input": 8, "intermediate_size": [128]*4, "activation_sparsity_pattern": [0.0]*4, "vocab_size_per_layer_input": 200}),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {"attention_chunk_size": 32, "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 128, "interleave_moe_layer_step": 1, "num_hidden_layers": 4}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2}),
    "phi3_sw2047": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 2047}),
    "starcoder2_sw": ("Starcoder2Config", "Starcoder2ForCausalLM", {"sliding_window": 4096}),
    "qwen2_sw_off": ("Qwen2Config", "Qwen2ForCausalLM", {"sliding_window": 32768, "use_sliding_window": False}),
    "qwen2_sw_on": ("Qwen2Config", "Qwen2ForCausalLM", {"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 1}),
    "gemma3_default_sw": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"num_hidden_layers": 6}),
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4}),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 6, "global_head_dim": 32}),
    "gemma4_keqv": ("Gemma4TextConfig", "Gemma4ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 6, "global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1}),
    "gemma4_kvshare": ("Gemma4TextConfig", "Gemma4ForCausalLM", {"sliding_window": 32, "num_hidden_layers": 6, "global_head_dim": 32, "num_kv_shared_layers": 2, "layer_types": ["sliding_attention", "full_attention"] * 3}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM", {"sliding_window": 32, "num_hidden_layers": 4}),
    "llama_hd24": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 24}),
    "llama_hd8": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 8}),
    "llama_hd256": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 256}),
    "gpt_oss_nosink": ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32, "head_dim": 16}),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {}),
    "diffllama": ("DiffLlamaConfig", "DiffLlamaForCausalLM", {}),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {}),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {}),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {}),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {}),
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", {}),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM", {}),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 2048, "n_ctx": 2048}),
    "xglm": ("XGLMConfig", "XGLMForCausalLM", {"d_model": 64, "num_layers": 2, "attention_heads": 4, "ffn_dim": 128}),
    "biogpt": ("BioGptConfig", "BioGptForCausalLM", {}),
    "jetmoe": ("JetMoeConfig", "JetMoeForCausalLM", {"num_local_experts": 2, "num_experts_per_tok": 1, "kv_channels": 16}),
}


def build(name):
    cfg_cls, model_cls, extra = FAMILIES[name]
    cfg_cls, model_cls = getattr(T, cfg_cls), getattr(T, model_cls)
    kw = dict(C)
    kw.update(extra)
    for k in kw.pop("__drop__", []):
        kw.pop(k, None)
    torch.manual_seed(0)
    cfg = cfg_cls(**kw)
    for k, v in kw.items():  # some configs ignore kwargs
        pass
    model = model_cls(cfg).eval()
    return model


def greedy(model, ids, cache=None, n=40, mask=None, **gk):
    kw = dict(max_new_tokens=n, do_sample=False, return_dict_in_generate=True, output_logits=True,
              pad_token_id=0, eos_token_id=None)
    kw.update(gk)
    if cache is not None:
        kw["past_key_values"] = cache
    if mask is not None:
        kw["attention_mask"] = mask
    with torch.no_grad():
        out = model.generate(ids, **kw)
    return out


def teacher_forced(model, seq, P, cache):
    """Prefill seq[:, :P] into cache, then feed seq[:, P:] one token at a time; logits [steps, V] per position P-1.."""
    logits = []
    with torch.no_grad():
        o = model(seq[:, :P], use_cache=True, **cache_kwargs(model, cache))
        logits.append(o.logits[:, -1])
        for t in range(P, seq.shape[1]):
            o = model(seq[:, t:t + 1], use_cache=True, **cache_kwargs(model, cache))
            logits.append(o.logits[:, -1])
    return torch.stack(logits, 1)


def fmt(x):
    return f"{x:.2e}"


def check(name, P, N=40, presets=("k8v8_g128", "k4v2_g128")):
    model = build(name)
    V = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (1, P), generator=g)
    ref = greedy(model, ids, n=N)
    seq = ref.sequences
    with torch.no_grad():
        full = model(seq).logits[:, P - 1:]  # exact logits at each position, no cache
    # a "broken" baseline: first decode token attending only to itself
    with torch.no_grad():
        self_only = model(seq[:, P:P + 1], position_ids=torch.tensor([[P]])).logits[:, -1]
    res = {"P": P, "scale": fmt(full.abs().max().item()), "selfonly_d1": fmt((self_only - full[:, 1]).abs().max().item()),
           "dyn_vs_full": fmt(max((l - full[:, i]).abs().max().item() for i, l in enumerate(ref.logits)))}
    for preset in presets:
        try:
            cache = KVarNCache(model.config, preset=preset)
            out = greedy(model, ids, cache=cache, n=N)
            restore_attention(model.config)
            toks = out.sequences[0, P:]
            rt = seq[0, P:]
            same = (toks == rt).tolist()
            first = same.index(False) if False in same else len(same)
            cache2 = KVarNCache(model.config, preset=preset)
            tf = teacher_forced(model, seq, P, cache2)
            restore_attention(model.config)
            d = (tf - full).abs().amax(dim=(0, 2))
            res[preset] = dict(match=f"{sum(same)}/{len(same)}", first_div=first,
                               d1=fmt(d[1].item()), dmax=fmt(d[1:].max().item()), nan=bool(torch.isnan(tf).any()))
        except Exception as e:
            restore_attention(model.config)
            res[preset] = f"EXC {type(e).__name__}: {str(e)[:300]}"
            if "-v" in sys.argv:
                traceback.print_exc()
    return res


if __name__ == "__main__":
    print("transformers", transformers.__version__)
    names = [a for a in sys.argv[1:] if not a.startswith("-")]
    for name in names:
        for P in (40, 300):
            t0 = time.time()
            try:
                r = check(name, P)
            except Exception as e:
                r = f"BUILD/REF EXC {type(e).__name__}: {str(e)[:300]}"
                if "-v" in sys.argv:
                    traceback.print_exc()
            print(name, r, f"{time.time() - t0:.1f}s", flush=True)
