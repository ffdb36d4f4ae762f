"""s10: compare the SASS of every kernel in two sets of object files (extracted from the prebuilt
libkvarn_cuda_kernels.a: `ar x`), instruction text and encodings, names' anonymous-namespace hash aside.
    python3 h200_s10_sasscmp.py OLD_DIR NEW_DIR attend_d64.cu attend_d128.cu ...   (reads DIR/NAME.o)
cuobjdump / nvdisasm 13.5 from the nvidia-cuda-* pip wheels, unpacked under /tmp on the dev machine."""
import re, subprocess, sys, collections
CUOBJ = "/tmp/cuobj/nvidia/cu13/bin/cuobjdump"
import os; os.environ["NVDISASM_PATH"] = "/tmp/cuobj2/nvidia/cu13/bin/nvdisasm"; os.environ["PATH"] = "/tmp/cuobj2/nvidia/cu13/bin:" + os.environ["PATH"]
def funcs(obj):
    out = subprocess.run([CUOBJ, "-sass", obj], capture_output=True, text=True, check=True).stdout
    fs = collections.OrderedDict(); cur = None; arch = None
    for line in out.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m: arch = m.group(1)
        m = re.match(r"\s*Function : (\S+)", line)
        if m: cur = (arch, re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__X_", m.group(1))); fs[cur] = []; continue
        if cur is None: continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*/\* (0x[0-9a-f]+) \*/", line)
        if m: fs[cur].append((m.group(2), m.group(3))); continue
        m = re.match(r"\s*/\* (0x[0-9a-f]+) \*/", line)
        if m and fs[cur]: fs[cur][-1] = fs[cur][-1] + (m.group(1),)
    return fs
tot = same = 0; ninstr = 0
for name in sys.argv[3:]:
    a, b = funcs(f"{sys.argv[1]}/{name}.o"), funcs(f"{sys.argv[2]}/{name}.o")
    if set(a) != set(b):
        print(name, "function sets differ:", set(a) ^ set(b))
    for k in a:
        if k not in b: continue
        tot += 1
        if a[k] == b[k]:
            same += 1; ninstr += len(a[k])
        else:
            ta = [x[0] for x in a[k]]; tb = [x[0] for x in b[k]]
            print(f"DIFF {name} {k[1][:120]}: {len(a[k])} vs {len(b[k])} instrs, text equal: {ta == tb}")
    print(f"{name}: {len(a)} functions (old), {len(b)} (new)")
print(f"identical (text + encodings): {same} of {tot} functions, {ninstr} instructions")
