#include <chrono>
#include <cstdio>
#include <cstdint>
int main() {
    const long N = 100000000; uint64_t x = 3;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (4.0 * N);
    printf("imul chain %.4f ns -> %.2f GHz (3-cycle latency)\n", ns, 3.0 / ns);
    return (int)(x & 1);
}
