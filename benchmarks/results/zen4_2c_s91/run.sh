#!/bin/bash
# Fifty-first session (Zen 4 box, AMD EPYC family 25 model 17, 2 vCPUs): the Zen 4's zmm pipe sharing
# (pipes.c) and where an avx512 int16 record's cycles go (record_stages.cpp, records from mkrec.py).
# Needs an installed kvarn on PYTHONPATH for mkrec.py. Run from this folder.
set -e
F="-O3 -std=c++17 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c -ffp-contract=off -Wno-unused-result"
gcc -O2 -mavx512f -mavx512bw -mavx512vnni -mavx512vl pipes.c -o /tmp/kvarn_pipes && /tmp/kvarn_pipes
python mkrec.py >/dev/null
g++ $F -I../../../include -I../../../native/cpu -I../../../native/cpu/scalar record_stages.cpp -o /tmp/kvarn_record_stages
/tmp/kvarn_record_stages
rm -f rec64.bin rec128.bin k64.bin k128.bin v64.bin v128.bin
