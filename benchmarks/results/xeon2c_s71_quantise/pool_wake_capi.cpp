#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <algorithm>
#include <random>
#include "kvarn/kvarn.h"
using clk = std::chrono::steady_clock;
int main(int argc, char** argv) {
    const int H = atoi(argv[1]), D = atoi(argv[2]), idle_us = atoi(argv[3]);
    std::vector<float> k((size_t)H * 128 * D), v(k.size());
    std::mt19937 g(1); std::normal_distribution<float> nd;
    for (auto& x : k) x = nd(g); for (auto& x : v) x = nd(g);
    std::vector<uint8_t> rec(1 << 20);
    for (int th : {1, 2}) {
        std::vector<double> ts;
        for (int i = 0; i < 200; ++i) {
            if (idle_us) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
            auto t0 = clk::now();
            int rc = kvarn_quantize_tiles(k.data(), v.data(), H, 4, 2, 128, D, 8, rec.data(), th, nullptr);
            ts.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
            if (rc) { printf("rc %d\n", rc); return 1; }
        }
        std::sort(ts.begin(), ts.end());
        printf("H%d D%d idle %d us, %d threads: min %.1f med %.1f us\n", H, D, idle_us, th, ts[0], ts[ts.size() / 2]);
    }
}
