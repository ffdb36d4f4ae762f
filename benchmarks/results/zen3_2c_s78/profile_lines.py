# What breakdown.py (perf samples), breakdown_samples.py and fnlines.py (sampler.so samples) share: the stages of
# a record by line of attend_tiles_impl, the loops' functions by name, source lines by addr2line -i, and sampler.so
# output mapped to the native module's link-time addresses (/proc/self/maps, readelf's LOAD segments, nm).
# Line ranges for 7dd1212's kernels_avx2.cpp / kernels_avx512.cpp.
import bisect, collections, os, re, subprocess

STAGES_BY_FILE = {
    "kernels_avx2.cpp": [(852, 867, "fp16 scale vectors"), (868, 904, "query prep (q ka, int16 rounding)"),
                         (905, 932, "scores: call, rescale"), (933, 961, "weights (exp, p va, int16 rounding)"),
                         (962, 971, "values: call"), (972, 979, "accumulation")],
    "kernels_avx512.cpp": [(841, 857, "fp16 scale vectors"), (858, 890, "query prep (q ka, int16 rounding)"),
                           (891, 912, "scores: call"), (913, 923, "weights (exp, p va, int16 rounding)"),
                           (924, 933, "values: call"), (934, 942, "accumulation")],
}
IMPL = "attend_tiles_impl<4, 2>"


def lines_of(so, source, address):
    """The lines of source in address's inline chain, innermost first."""
    out = subprocess.run(["addr2line", "-i", "-e", so, hex(address)], capture_output=True, text=True).stdout
    return [int(m) for m in re.findall(re.escape(source) + r":(\d+)", out)]


def stage_of_function(name):
    """The stage a function out of attend_tiles_impl belongs to by its name (the loops' own functions, or the
    dispatch lambdas they are inlined into: GCC 12 and 13 differ), else None."""
    if "scores_int16_dispatch" in name or "tile_scores_k4_int16" in name:
        return "score loop"
    if any(f in name for f in ("values_v2_int16_dispatch", "tile_values_v2_int16", "values_chunk_v2_int16")):
        return "value loop"
    if "weights_heads" in name:
        return "weights (exp, p va, int16 rounding)"
    return None


def impl_stages(so, source, impl_addresses):
    """{stage: samples} of attend_tiles_impl's own samples ({link-time address: samples}), by the outermost line of
    the inline chain."""
    counts = collections.Counter()
    for address, n in impl_addresses.items():
        lines = lines_of(so, source, address)
        outer = lines[-1] if lines else 0
        counts[next((s for lo, hi, s in STAGES_BY_FILE[source] if lo <= outer <= hi),
                    "other lines of attend_tiles_impl")] += n
    return counts


def impl_address(so, source):
    """Link-time address of source's attend_tiles_impl<4, 2> (each ISA's file has one, under the same name)."""
    return next(a for a in (int(l.split()[0], 16) for l in subprocess.run(["nm", "-C", so], capture_output=True,
                text=True).stdout.splitlines() if IMPL in l) if lines_of(so, source, a + 16))


class Module:
    """sampler.so's samples of one process mapped to link-time addresses of the native module so."""

    def __init__(self, samples_path, so):
        name = os.path.basename(so)
        self.maps = []  # (start, end, file offset) of the module's mappings; it may have moved since: by file name
        for line in open(samples_path + ".maps"):
            parts = line.split()
            if len(parts) >= 6 and os.path.basename(parts[5]) == name:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                self.maps.append((start, end, int(parts[2], 16)))
        self.segments = []  # (file offset, size, vaddr) of the LOAD segments
        for line in subprocess.run(["readelf", "-lW", so], capture_output=True, text=True).stdout.splitlines():
            if line.strip().startswith("LOAD"):
                f = line.split()
                self.segments.append((int(f[1], 16), int(f[4], 16), int(f[2], 16)))
        self.symbols = []  # (address, size, demangled name)
        for line in subprocess.run(["nm", "-C", "-S", "--defined-only", so], capture_output=True,
                                   text=True).stdout.splitlines():
            m = re.match(r"([0-9a-f]+) ([0-9a-f]+) [tTwW] (.*)", line)
            if m:
                self.symbols.append((int(m[1], 16), int(m[2], 16), m[3]))
        self.symbols.sort()
        self.starts = [s[0] for s in self.symbols]
        self.samples = [int(line, 16) for line in open(samples_path)]

    def address(self, ip):
        """ip's link-time address in the module, or None outside it."""
        for start, end, off in self.maps:
            if start <= ip < end:
                file_off = ip - start + off
                for seg_off, size, seg_vaddr in self.segments:
                    if seg_off <= file_off < seg_off + size:
                        return file_off - seg_off + seg_vaddr
        return None

    def function(self, address):
        """The demangled name of the function holding address ("?" between functions)."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.symbols[i][0] + max(self.symbols[i][1], 1):
            return self.symbols[i][2]
        return "?"
