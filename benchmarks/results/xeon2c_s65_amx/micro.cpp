#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <unistd.h>
#include <sys/syscall.h>
#include "amx.h"
using namespace kvarn;
int main(int argc, char** argv) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { perror("prctl"); return 1; }
    const int D = 128, G = 128, nrec = NREC;
    const size_t rec = 13824;
    std::vector<uint8_t> buf(rec * nrec);
    for (auto& x : buf) x = rand();
    alignas(64) int16_t q[4 * 256], w[4 * 128];
    for (auto& x : q) x = rand(); for (auto& x : w) x = rand() & 0x7fff;
    alignas(64) int32_t sums[4096];
    amx_begin();
    for (int rep = 0; rep < 5; ++rep) {
        double ts = 0, tv = 0;
        for (int pass = 0; pass < 20; ++pass) {
            auto t0 = std::chrono::steady_clock::now();
            for (int r = 0; r < nrec; ++r) { AmxPrefetch pf{nullptr, nullptr}; amx_k4_scores(buf.data() + r * rec, D, G, q, false, 4, sums, pf); }
            auto t1 = std::chrono::steady_clock::now();
            for (int r = 0; r < nrec; ++r) { AmxPrefetch pf{nullptr, nullptr}; amx_v2_values(buf.data() + r * rec + 8192 + 768, D, G, w, 4, sums, pf); }
            auto t2 = std::chrono::steady_clock::now();
            ts += std::chrono::duration<double, std::nano>(t1 - t0).count(); tv += std::chrono::duration<double, std::nano>(t2 - t1).count();
        }
        printf("per record: scores %.0f ns, values %.0f ns\n", ts / (20 * nrec), tv / (20 * nrec));
    }
    amx_end();
}
