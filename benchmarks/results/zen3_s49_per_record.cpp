// Fourteenth session: one core's cost per k4v2 record (tile x kv head, D 128, 4 query heads) of kvarn_attend over
// records only (200 tiles, L3-resident), through the C API, int16 or float scores. Output: zen3_s49_per_record.log.
// per-record cost of kvarn_attend over records only (no sink/tail), 1 thread
#include "kvarn/kvarn.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int n_tiles = argc > 1 ? atoi(argv[1]) : 4, D = argc > 2 ? atoi(argv[2]) : 128, hq = argc > 3 ? atoi(argv[3]) : 4;
  const char* mode = argc > 4 ? argv[4] : "int16";
  int G = 128;
  kvarn_set_score_mode(strcmp(mode, "float") == 0 ? 0 : 1);
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  std::vector<float> k((size_t)n_tiles * G * D), v(k.size());
  for (auto& x : k) x = nd(rng); for (auto& x : v) x = nd(rng);
  kvarn_record_layout L = kvarn_layout(4, 2, G, D);
  std::vector<uint8_t> rec((size_t)n_tiles * L.total);
  int rc = kvarn_quantize_tiles(k.data(), v.data(), n_tiles, 4, 2, G, D, 20, rec.data(), 1, nullptr);
  if (rc) { printf("quantize rc %d\n", rc); return 1; }
  kvarn_cache_view cv{}; cv.num_kv_heads = 1; cv.head_dim = D; cv.group = G; cv.kbits = 4; cv.vbits = 2;
  cv.records = rec.data(); cv.num_tiles = n_tiles; cv.record_tile_stride = L.total; cv.record_head_stride = L.total;
  std::vector<float> q((size_t)hq * D), out(q.size());
  for (auto& x : q) x = nd(rng);
  double best = 1e9;
  for (int r = 0; r < 200; ++r) {
    double t = now();
    int reps = 20;
    for (int i = 0; i < reps; ++i) kvarn_attend(&cv, 1, q.data(), hq, 0.088f, out.data(), 1);
    best = std::min(best, (now() - t) / reps);
  }
  printf("%s isa %s tiles %d D %d hq %d: %.3f us/record (%.1f MACs/ns)\n", mode, kvarn_active_isa(), n_tiles, D, hq,
         best / n_tiles * 1e6, 2.0 * G * D * hq / (best / n_tiles * 1e9));
}
