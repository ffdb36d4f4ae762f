#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>
#include <algorithm>
#include <utility>
#include <immintrin.h>
#include <sched.h>
#include <pthread.h>
static int kvarn_default_threads() { return 2; }
std::atomic<long> helper_first_ns{0}; long tl[64][4]; std::atomic<int> tln{0}; long T0; std::atomic<int> helper_items{0}; std::atomic<long> helper_busy_ns{0}, caller_busy_ns{0};
static long nowns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
class ThreadPool {
public:
    template <typename F>
    void run(int64_t n, int threads, F& fn)
    {
        if (n <= 0) return;
        if (threads <= 1 || n == 1) return run_here(n, fn);
        std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
        if (!busy.owns_lock()) return run_here(n, fn);
        const int helpers = (int)std::min<int64_t>(std::min(threads, max_threads_) - 1, n - 1);
        if (helpers <= 0 || !grow(helpers)) return run_here(n, fn);
        // Seqlock-style publish: odd generation = being written. A worker
        // registers (active_++) and then re-reads the generation; the writer
        // makes it odd and then waits for active_ == 0 (both seq_cst), so a
        // worker never works on half-written fields.
        // Spin after this job only if it followed the previous one closely (see above).
        const int64_t start = now_ns();
        spin_after_job_.store(start - last_end_ns_ <= kSpinNs, std::memory_order_relaxed);
        const uint64_t g = gen_.load(std::memory_order_relaxed);
        gen_.store(g + 1);
        while (active_.load() != 0) pause();
        call_ = &invoke<F>;
        ctx_ = &fn;
        n_ = n;
        max_workers_ = helpers;
        next_.store(0);
        done_.store(0);
        failed_.store(false, std::memory_order_relaxed);
        error_ = nullptr;
        gen_.store(g + 2);
        if (sleeping_.load() > 0) {
            if (getenv("STEER")) {
                const int me = sched_getcpu();
                cpu_set_t set; CPU_ZERO(&set);
                sched_getaffinity(0, sizeof(set), &set);
                if (me >= 0 && CPU_COUNT(&set) > 1) {
                    CPU_CLR(me, &set);
                    for (auto& t : workers_) pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
                }
            }
            std::lock_guard<std::mutex> lk(mu_);
            cv_.notify_all();
        }
        work();
        while (done_.load(std::memory_order_acquire) < n) pause();
        last_end_ns_ = now_ns();
        // error_ was written before its item's done_ release, and done_ was read with acquire.
        if (failed_.load(std::memory_order_relaxed)) std::rethrow_exception(std::exchange(error_, nullptr));
    }

private:
    // Every item on the calling thread, with the pool's contract: all items run, then the first
    // exception is rethrown (one thread, one item, a busy pool, or no helper thread to be had).
    template <typename F>
    static void run_here(int64_t n, F& fn)
    {
        std::exception_ptr first;
        for (int64_t i = 0; i < n; ++i) {
            try {
                fn(i);
            } catch (...) {
                if (!first) first = std::current_exception();
            }
        }
        if (first) std::rethrow_exception(first);
    }

    template <typename F>
    static void invoke(void* ctx, int64_t i)
    {
        (*static_cast<F*>(ctx))(i);
    }

    static constexpr int64_t kSpinNs = 200000;  // the most a helper spins after a job

    static int64_t now_ns()
    {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }

    static void pause()
    {
#if defined(__x86_64__) || defined(__i386__)
        _mm_pause();
#else
        std::this_thread::yield();
#endif
    }

    void work()
    {
        for (;;) {
            const int64_t i = next_.fetch_add(1);
            if (i >= n_) return;
            try {
                call_(ctx_, i);
            } catch (...) {
                if (!failed_.exchange(true, std::memory_order_relaxed)) error_ = std::current_exception();
            }
            done_.fetch_add(1, std::memory_order_release);
        }
    }

    bool grow(int helpers)
    {
        try {
            while ((int)workers_.size() < helpers) {
                const int idx = (int)workers_.size();
                workers_.emplace_back([this, idx] { worker(idx); });
            }
        } catch (...) {
            return false;  // could not start a thread: the caller runs the items itself
        }
        return true;
    }

    void worker(int idx)
    {
        uint64_t seen = gen_.load();
        for (;;) {
            uint64_t g;
            const auto t0 = std::chrono::steady_clock::now();
            const auto spin_for = std::chrono::nanoseconds(spin_after_job_.load(std::memory_order_relaxed) ? kSpinNs : 0);
            int spins = 0;
            bool slept = false;  // once asleep, stay asleep until a job: no new spin per wake-up
            while ((g = gen_.load(std::memory_order_acquire)) == seen || (g & 1)) {
                if (slept || (++spins % 256 == 0 && std::chrono::steady_clock::now() - t0 > spin_for)) {
                    std::unique_lock<std::mutex> lk(mu_);
                    sleeping_.fetch_add(1);
                    // A timed wait: the publisher checks sleeping_ without the lock, so a
                    // notification can be missed; the caller does the items meanwhile.
                    cv_.wait_for(lk, std::chrono::milliseconds(100), [&] {
                        const uint64_t x = gen_.load();
                        return x != seen && !(x & 1);
                    });
                    sleeping_.fetch_sub(1);
                    slept = true;
                } else {
                    pause();
                }
            }
            seen = g;
            active_.fetch_add(1);
            if (gen_.load() == g && idx < max_workers_) work();
            active_.fetch_sub(1);
        }
    }

    std::mutex run_mu_, mu_;
    std::condition_variable cv_;
    std::vector<std::thread> workers_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> active_{0}, sleeping_{0};
    std::atomic<int64_t> next_{0}, done_{0};
    std::atomic<bool> failed_{false};
    // When the last job ended (steady clock, ns; 0: none yet, so the first job is "after idle"); only run()
    // reads and writes it, under run_mu_. Whether helpers spin after the current job (they read it).
    int64_t last_end_ns_ = 0;
    std::atomic<bool> spin_after_job_{false};
    std::exception_ptr error_;  // the first item's exception; written by the thread that set failed_
    void (*call_)(void*, int64_t) = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    int max_workers_ = 0;
    const int max_threads_ = std::max<int>(1, kvarn_default_threads());
};
volatile double sink;
void busy(int n) { double x = 1.0; for (int i = 0; i < n; ++i) x = x * 1.0000001 + 1e-9; sink = x; }
int main(int argc, char** argv) {
    ThreadPool pool;
    int idle = atoi(argv[1]), n = atoi(argv[2]), items = atoi(argv[3]);
    std::thread::id caller = std::this_thread::get_id();
    std::vector<double> ts, firsts;
    for (int r = 0; r < 200; ++r) {
        if (idle) std::this_thread::sleep_for(std::chrono::microseconds(idle));
        helper_first_ns.store(0);
        long t0 = nowns(); T0 = t0; tln = 0;
        auto fn = [&](int64_t) { if (std::this_thread::get_id() != caller) { long z = 0; helper_first_ns.compare_exchange_strong(z, nowns()); } long a = nowns(); busy(n); long b = nowns() - a; { int q = tln++; if (q < 64) { tl[q][0] = a - T0; tl[q][1] = a + b - T0; tl[q][2] = std::this_thread::get_id() != caller; tl[q][3] = sched_getcpu(); } } if (std::this_thread::get_id() != caller) { helper_items++; helper_busy_ns += b; } else caller_busy_ns += b; };
        pool.run(items, 2, fn);
        ts.push_back((nowns() - t0) / 1e3); if (r >= 195) { printf("job %.1f us:", ts.back()); for (int q = 0; q < tln && q < 64; ++q) printf(" [%s cpu%ld %.1f-%.1f]", tl[q][2] ? "H" : "C", tl[q][3], tl[q][0] / 1e3, tl[q][1] / 1e3); printf("\n"); }
        firsts.push_back(helper_first_ns.load() ? (helper_first_ns.load() - t0) / 1e3 : -1);
    }
    std::sort(ts.begin(), ts.end()); std::sort(firsts.begin(), firsts.end());
    printf("helper items %.2f per job, helper us/item %.1f, caller us/item %.1f\n", helper_items.load() / 200.0, helper_busy_ns.load() / 1e3 / std::max(1, helper_items.load()), caller_busy_ns.load() / 1e3 / (200.0 * items - helper_items.load()));
    printf("idle %d: job med %.1f us; helper's first item at med %.1f us (min %.1f, -1 = never)\n", idle, ts[100], firsts[100], firsts[0]);
    fflush(stdout); _Exit(0);
}
