// Sixty-fifth session: is the VM's slow spell after >= 1.5 ms of anything (../emr2c_s104/cold_attend.log) tied to
// times the vCPU did not run? gcc -O2 -DGAP=600 tick_probe.c (GAP: TSC cycles that count as a gap); tick_probe.log.
// Spins reading the TSC; a jump > 3 us between two reads is a time the vCPU did not run (an exit / a tick).
// Runs a fixed workload (a branchy loop over a 16 KB table + a 256 KB array sum) in a loop and times each
// run, recording how long after the last detected gap it started.
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <x86intrin.h>
static uint64_t rd(void) { unsigned a; return __rdtscp(&a); }
static volatile uint64_t sink;
static uint32_t table[4096];
static float arr[65536];
static uint64_t work(uint32_t seed) {
  uint64_t acc = 0; uint32_t x = seed;
  for (int i = 0; i < 4000; ++i) {  // data-dependent branches: needs a trained predictor
    x = x * 1664525u + 1013904223u;
    uint32_t t = table[x >> 20];
    if (t & 1) acc += t; else if (t & 2) acc ^= t; else if (t & 4) acc -= x; else acc += 3;
  }
  float s = 0; for (int i = 0; i < 65536; i += 16) s += arr[i];  // one load per line: 256 KB
  return acc + (uint64_t)s;
}
int main(int argc, char** argv) {
  double ghz = 3.08;  // TSC rate (the box's)
  for (int i = 0; i < 4096; ++i) table[i] = (i * 2654435761u) >> 7;
  for (int i = 0; i < 65536; ++i) arr[i] = i;
  const int N = 200000;
  uint64_t* dur = malloc(N * 8); uint64_t* since = malloc(N * 8); uint64_t* gapl = malloc(N * 8);
  uint64_t last_gap = rd(), last_gap_len = 0, prev = rd();
  for (int n = 0; n < N; ++n) {
    // a short spin (~2 us) watching for gaps, then the workload
    uint64_t s0 = rd();
    while (1) { uint64_t t = rd(); if (t - prev > GAP) { last_gap = t; last_gap_len = t - prev; } prev = t; if (t - s0 > 2 * 3080) break; }
    uint64_t a = rd(); sink += work(12345); uint64_t b = rd();
    if (b - a > 3 * 3080 * 10) { /* the workload itself straddled a gap: skip */ dur[n] = 0; prev = b; continue; }
    prev = b;
    dur[n] = b - a; since[n] = a - last_gap; gapl[n] = last_gap_len;
  }
  // bucket by time since the last gap (us)
  int edges[] = {0, 10, 25, 50, 100, 200, 400, 800, 1600, 100000000};
  for (int e = 0; e + 1 < 10; ++e) {
    double sum = 0; int cnt = 0; uint64_t mn = ~0ull;
    for (int n = 1000; n < N; ++n) { if (!dur[n]) continue; double us = since[n] / (ghz * 1000);
      if (us >= edges[e] && us < edges[e + 1]) { sum += dur[n]; cnt++; if (dur[n] < mn) mn = dur[n]; } }
    if (cnt) printf("since gap %6d-%-9d us: %7d runs, mean %.2f us, min %.2f us\n", edges[e], edges[e + 1], cnt, sum / cnt / (ghz * 1000), mn / (ghz * 1000));
  }
  // gap statistics
  return 0;
}
