// Mini copy of kvarn's ThreadPool with two sleep mechanisms: condvar (as api.cpp) and futex on gen_.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
int g_futex = 0;
class Pool {
public:
    explicit Pool(int helpers) { for (int i = 0; i < helpers; ++i) workers_.emplace_back([this, i] { worker(i); }); }
    template <typename F> void run(int64_t n, int helpers, F& fn) {
        caller_cpu = sched_getcpu();
        run_start_ns = std::chrono::steady_clock::now().time_since_epoch().count();
        const uint32_t g = gen_.load(std::memory_order_relaxed);
        gen_.store(g + 1);
        while (active_.load() != 0) _mm_pause();
        call_ = &invoke<F>; ctx_ = &fn; n_ = n; max_workers_ = helpers;
        next_.store(0); done_.store(0);
        gen_.store(g + 2);
        if (sleeping_.load() > 0) {
            if (g_futex) syscall(SYS_futex, (uint32_t*)&gen_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
            else { std::lock_guard<std::mutex> lk(mu_); cv_.notify_all(); }
        }
        work();
        while (done_.load(std::memory_order_acquire) < n) _mm_pause();
    }
private:
    template <typename F> static void invoke(void* c, int64_t i) { (*static_cast<F*>(c))(i); }
    int work() { int k = 0; for (;;) { int64_t i = next_.fetch_add(1); if (i >= n_) return k; ++k; call_(ctx_, i); done_.fetch_add(1, std::memory_order_release); } }
    void worker(int idx) {
        if (getenv("PIN")) { cpu_set_t cs; CPU_ZERO(&cs); int ncpu = std::thread::hardware_concurrency(); CPU_SET((idx + 1) % ncpu, &cs); pthread_setaffinity_np(pthread_self(), sizeof cs, &cs); }
        uint32_t seen = gen_.load();
        for (;;) {
            uint32_t g; auto t0 = std::chrono::steady_clock::now(); int spins = 0; bool slept = false;
            while ((g = gen_.load(std::memory_order_acquire)) == seen || (g & 1)) {
                if (slept || (++spins % 256 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(200))) {
                    sleeping_.fetch_add(1);
                    if (g_futex) {
                        if (g == seen || (g & 1)) { timespec ts{0, 100000000}; syscall(SYS_futex, (uint32_t*)&gen_, FUTEX_WAIT_PRIVATE, g, &ts, nullptr, 0); }
                    } else {
                        std::unique_lock<std::mutex> lk(mu_);
                        cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { uint32_t x = gen_.load(); return x != seen && !(x & 1); });
                    }
                    sleeping_.fetch_sub(1); slept = true;
                } else _mm_pause();
            }
            seen = g; active_.fetch_add(1);
            if (gen_.load() == g && idx < max_workers_) { helper_start_ns.store(std::chrono::steady_clock::now().time_since_epoch().count() - run_start_ns); int k = work(); helper_items += (k > 0); helper_cpu_same += (sched_getcpu() == caller_cpu); }
            active_.fetch_sub(1);
        }
    }
    std::mutex mu_; std::condition_variable cv_; std::vector<std::thread> workers_;
    std::atomic<uint32_t> gen_{0}; std::atomic<int> active_{0}, sleeping_{0};
    std::atomic<int64_t> next_{0}, done_{0};
public: std::atomic<int> caller_cpu{-1}; std::atomic<long> helper_cpu_same{0}; std::atomic<long> helper_items{0}, helper_start_ns{0}; long run_start_ns = 0; private:
    void (*call_)(void*, int64_t) = nullptr; void* ctx_ = nullptr; int64_t n_ = 0; int max_workers_ = 0;
};
static double spin_work(int us) { auto t0 = std::chrono::steady_clock::now(); double x = 1; while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(us)) x = x * 1.0000001 + 1e-9; return x; }
int main(int argc, char** argv) {
    g_futex = atoi(argv[1]); int threads = atoi(argv[2]); int items = atoi(argv[3]); int item_us = atoi(argv[4]); int idle_us = atoi(argv[5]);
    Pool p(threads - 1);
    volatile double sink = 0;
    auto fn = [&](int64_t) { sink = sink + spin_work(item_us); };
    std::vector<double> t;
    for (int r = 0; r < 200; ++r) {
        if (idle_us) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
        auto a = std::chrono::steady_clock::now();
        p.run(items, threads - 1, fn);
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    printf("helper on the caller's cpu in %ld runs; ", p.helper_cpu_same.load()); printf("helpers that took an item, per run: %.2f; last join after %.1f us\n", p.helper_items.load() / 200.0, p.helper_start_ns.load() / 1e3);
    printf("%-7s threads %2d items %3d x %3d us, idle %5d us: min %7.1f p25 %7.1f med %7.1f p90 %7.1f us (ideal %.1f)\n", g_futex ? "futex" : "condvar", threads, items, item_us, idle_us,
           t[0], t[t.size() / 4], t[t.size() / 2], t[t.size() * 9 / 10], (double)((items + threads - 1) / threads) * item_us);
    fflush(stdout); _exit(0);
}
