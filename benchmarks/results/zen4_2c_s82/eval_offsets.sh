#!/bin/bash
# Forty-second session: the real decode path's KL(fp32 || cache) at k4v2 in the int8 mode, old (/tmp/site_s42) and
# new (/tmp/site_new, centred key codes) builds, over three more windows of the Verne text (the CI venv's torch,
# transformers and SmolLM2 wheel); JSON per run in eval/.
R=/work/main/benchmarks/results/zen4_2c_s82
for off in 2048 4096 6144; do for b in old:s42 new:new; do
  KVARN_SCORES=int8 PYTHONPATH=/tmp/site_${b##*:} /tmp/kvarn-ci-venv/bin/python -m kvarn eval --presets k4v2_g128 \
    --no-baselines --gen-prompts 0 --threads 2 --offset $off --out /tmp/eval_${b%%:*}_int8_off$off > /dev/null 2>&1
  cp /tmp/eval_${b%%:*}_int8_off$off/results.json $R/eval/${b%%:*}_int8_off$off.json
  /tmp/kvarn-ci-venv/bin/python -c "import json; d=json.load(open('$R/eval/${b%%:*}_int8_off$off.json')); print('offset $off ${b%%:*}', [round(m['decode_path']['kl_cache'], 5) for m in d['methods'] if 'decode_path' in m])"
done; done
