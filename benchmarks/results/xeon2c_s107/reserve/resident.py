"""Resident memory that KVCache.reserve adds: eight caches (Hk 8, D 128, k4v2) with room for 32768 tokens each."""
import kvarn
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
caches = []
r0 = rss()
for layer in range(8):
    c = kvarn.KVCache(8, 128); c.reserve(32768); caches.append(c)
print(f"8 caches reserve(32768): allocated {sum(c.allocated_nbytes for c in caches)/2**20:.1f} MiB, resident +{rss()-r0:.1f} MiB")
