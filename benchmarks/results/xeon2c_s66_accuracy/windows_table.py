import json, sys
runs = [("0", "accuracy_smollm2_2048_offset0.json")] + [(o, f"accuracy_smollm2_2048_offset{o}.json") for o in ("2048", "4096", "6144")]
data = {}
for off, path in runs:
    try:
        r = json.load(open(path))
    except FileNotFoundError:
        continue
    data[off] = {m["name"]: m for m in r["methods"]}
    data[off]["_fp32"] = r["fp32"]
offs = list(data)
names = ["KVarN k4v2_g128", "KVarN k4v4_g128", "KVarN k2v2_g128", "KVarN k4v2_g64", "KVarN k4v4_g64", "KIVI k4v2_g128",
         "KIVI k4v4_g128", "KIVI k2v2_g128", "rotation-only k4v2_g128", "TurboQuant-style 3-bit", "TurboQuant-style 4-bit"]
print("| method | " + " | ".join(offs) + " | mean |")
for n in names:
    v = [data[o][n]["pseudo_decode"]["kl"] for o in offs]
    print(f"| {n} | " + " | ".join(f"{x:.4f}" for x in v) + f" | {sum(v)/len(v):.4f} |")
d = [100 * (data[o]["KVarN k4v2_g128"]["pseudo_decode"]["ppl"] / data[o]["_fp32"]["ppl"] - 1) for o in offs]
print("| k4v2_g128 Δppl | " + " | ".join(f"{x:+.2f} %" for x in d) + f" | {sum(d)/len(d):+.2f} % |")
print("| fp32 perplexity | " + " | ".join(f"{data[o]['_fp32']['ppl']:.3f}" for o in offs) + " | |")
