// Seventeenth session: kvarn_attend through the C API at 32K (255 tiles x 8 kv heads, k4v2, D 128, Hq 32) with
// 1 and 2 threads: min and median of 100 calls. g++ -O2 -std=c++17 -Iinclude zen3_s52_attend_threads.cpp libkvarn_core.a -lpthread
#include "kvarn/kvarn.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int n_tiles = atoi(argv[1]), Hk = atoi(argv[2]), threads = atoi(argv[3]); int head_major = argc > 4 ? atoi(argv[4]) : 0;
  int D = 128, G = 128, hq = 4 * Hk;
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  kvarn_record_layout L = kvarn_layout(4, 2, G, D);
  std::vector<float> k((size_t)64 * G * D), v(k.size());
  for (auto& x : k) x = nd(rng); for (auto& x : v) x = nd(rng);
  std::vector<uint8_t> base((size_t)64 * L.total);
  kvarn_quantize_tiles(k.data(), v.data(), 64, 4, 2, G, D, 20, base.data(), 1, nullptr);
  std::vector<uint8_t> rec((size_t)n_tiles * Hk * L.total);
  for (size_t i = 0; i < (size_t)n_tiles * Hk; ++i) std::copy(base.begin() + (i % 64) * L.total, base.begin() + (i % 64 + 1) * L.total, rec.begin() + i * L.total);
  std::vector<uint16_t> sk((size_t)Hk * 128 * D, 0x3c00), sv(sk.size(), 0x3c00);
  kvarn_cache_view cv{}; cv.num_kv_heads = Hk; cv.head_dim = D; cv.group = G; cv.kbits = 4; cv.vbits = 2;
  cv.sink_k = sk.data(); cv.sink_v = sv.data(); cv.sink_len = 128; cv.sink_head_stride = 128 * D; cv.sink_row_stride = D;
  cv.records = rec.data(); cv.num_tiles = n_tiles;
  if (head_major) { cv.record_tile_stride = L.total; cv.record_head_stride = (int64_t)n_tiles * L.total; }
  else { cv.record_tile_stride = (int64_t)Hk * L.total; cv.record_head_stride = L.total; }
  std::vector<float> q((size_t)hq * D), out(q.size());
  for (auto& x : q) x = nd(rng) * 0.3f;
  double best = 1e9; std::vector<double> all;
  for (int r = 0; r < 100; ++r) {
    double t = now();
    kvarn_attend(&cv, 1, q.data(), hq, 0.088f, out.data(), threads);
    double e = now() - t; all.push_back(e); best = std::min(best, e);
  }
  std::sort(all.begin(), all.end());
  printf("tiles %d Hk %d threads %d %s: best %.3f ms median %.3f ms; %.3f us/record-thread\n", n_tiles, Hk, threads, head_major ? "head-major" : "tile-major",
         best * 1e3, all[50] * 1e3, best * threads / (n_tiles * Hk) * 1e6);
}
