#!/usr/bin/env bash
# Forty-seventh session: instructions per 32K decode call, kvarn (int16, int8) against the fp16-cache kernel, by
# callgrind (valgrind 3.19 has no AVX-512, so dispatch picks the avx2 kernels, without AVX-VNNI: the AVX2-only
# machines' instruction mix). SITE = an unstripped build (pip install --target SITE -C install.strip=false .).
set -eu
SITE=${1:?site} PY=${2:-python3} here=$(cd "$(dirname "$0")" && pwd) out=${3:-/tmp}
cd /tmp
for mode in int16 int8; do for shape in 3,9,64 8,32,128; do
  tag=$([ $mode = int16 ] && echo cg || echo cg8)_$shape
  KVARN_SCORES=$mode SHAPE=$shape CTX=32768 CALLS=4 PYTHONPATH=$SITE valgrind --tool=callgrind \
    --callgrind-out-file=$out/$tag.out "$PY" "$here/icount.py"
  callgrind_annotate --inclusive=yes $out/$tag.out | grep -E "PROGRAM TOTALS|kvarn::|kvarn_attend" | head -12 | cut -c1-220 > "$here/icount_$tag.txt"
done; done
"$PY" "$here/icount_summary.py" | tee "$here/icount_summary.log"
