// The C ABI: argument checks, loops over tiles, heads and sequences, thread
// fan-out and the split-K merge. Kernels come from the active ISA table.
// Nothing here throws across the ABI: every entry point catches and returns a status.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // _mm_pause (SSE2: baseline x86-64)
#endif

#include "dispatch.h"
#include "kvarn/kvarn.h"

using kvarn::KernelTable;
using kvarn::SoftmaxState;
using kvarn::TileFormat;

namespace {

bool format_ok(int kbits, int vbits, int group, int head_dim)
{
    return kvarn_bits_supported(kbits) && kvarn_bits_supported(vbits) && kvarn_group_supported(group) &&
           kvarn_head_dim_supported(head_dim);
}

// Whether n elements of `each` bytes fit in one object (at most PTRDIFF_MAX bytes). A larger
// count cannot describe a real buffer, and the index arithmetic over it would overflow.
bool fits(int64_t n, uint64_t each)
{
    return n >= 0 && (each == 0 || (uint64_t)n <= (uint64_t)PTRDIFF_MAX / each);
}

// Whether the bytes a strided part of a cache view spans, from its base pointer, fit in one
// object: heads [0, heads) at head_stride, rows [0, len) at row_stride, each row `row` units,
// all in units of `unit` bytes. Strides must be non-negative. len > 0, heads > 0.
bool span_fits(int64_t heads, int64_t head_stride, int64_t len, int64_t row_stride, int64_t row, int64_t unit)
{
    if (head_stride < 0 || row_stride < 0) return false;
    int64_t a, b, end, bytes;
    return !__builtin_mul_overflow(heads - 1, head_stride, &a) && !__builtin_mul_overflow(len - 1, row_stride, &b) &&
           !__builtin_add_overflow(a, b, &end) && !__builtin_add_overflow(end, row, &end) &&
           !__builtin_mul_overflow(end, unit, &bytes) && bytes <= (int64_t)PTRDIFF_MAX;
}

// n_tiles tiles of k, v (float32) and of records fit in memory (format already checked).
bool tiles_fit(int64_t n_tiles, int kbits, int vbits, int group, int head_dim)
{
    const uint64_t tile = (uint64_t)group * (uint64_t)head_dim * sizeof(float);
    const uint64_t rec = kvarn_layout(kbits, vbits, group, head_dim).total;
    return fits(n_tiles, std::max(tile, rec));
}

int resolve_threads(int32_t requested)
{
    return requested > 0 ? requested : kvarn_default_threads();
}

// num_threads as the kernels take it: <= 0 (all cores) or at most KVARN_MAX_THREADS, which bounds the
// split layout an attend builds from it (a huge count meant millions of work items and GBs of state).
bool threads_ok(int32_t requested) { return requested <= KVARN_MAX_THREADS; }

// The alignment kvarn.h asks of a pointer (fp16 fields and values are read and written as uint16_t,
// floats as float): checked, because a misaligned one is undefined behaviour in the scalar kernels.
bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }


// ---- thread pool ----------------------------------------------------------------
// For one size class of jobs that find the helpers asleep: the time per byte of the last kWindow jobs run
// each way, whose median is that way's estimate (one hiccup of a VM moves it little: a running mean that a
// slow outlier had pulled past the other way's kept the slower way running for dozens of jobs). Each way is
// tried kWarmUp times first (alternately); then the faster one runs and the other one now and then, so that a
// change in the machine is noticed: every kMinInterval-th job, or rarer where it is much slower, so that
// exploring costs about kExploreCost of the time at most (waking 15 helpers can be ~10x faster than running
// alone: every 16th job alone then cost ~1.5x on average), but at least every kMaxInterval-th job.
struct WakeChoice {
    static constexpr int kWarmUp = 3, kWindow = 8;
    static constexpr int64_t kMinInterval = 16, kMaxInterval = 4096;
    static constexpr double kExploreCost = 1.0 / 64;
    double ns_per_byte[2][kWindow] = {};  // [0] alone, [1] helpers woken; job i of a way at i % kWindow
    int64_t runs[2] = {0, 0};              // jobs run each way (also kvarn_testing_pool_wake_runs)
    int64_t since_explored = 0;            // jobs since the slower way last ran
    bool wake_next()
    {
        if (runs[0] < kWarmUp || runs[1] < kWarmUp) return runs[1] <= runs[0];
        const double alone = estimate(0), woken = estimate(1);
        const bool faster_wakes = woken < alone;
        const double slower_by = (faster_wakes ? alone / woken : woken / alone) - 1.0;
        const double interval = std::min((double)kMaxInterval, std::max((double)kMinInterval, slower_by / kExploreCost));
        if (++since_explored < interval) return faster_wakes;
        since_explored = 0;
        return !faster_wakes;
    }
    void learn(bool woke, double x) { ns_per_byte[woke][runs[woke]++ % kWindow] = x; }
    double estimate(bool woke) const  // the median of the way's last kWindow samples (kWarmUp or more)
    {
        const int n = (int)std::min<int64_t>(runs[woke], kWindow);
        double v[kWindow];
        for (int i = 0; i < n; ++i) {  // insertion sort (std::sort's unreachable n > 16 branch warns in GCC 12)
            int j = i;
            for (; j > 0 && v[j - 1] > ns_per_byte[woke][i]; --j) v[j] = v[j - 1];
            v[j] = ns_per_byte[woke][i];
        }
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
};

// Runs fn(i) for i in [0, n) on up to `threads` threads, the caller included,
// taking items dynamically. Completion waits for the *items*, not for every
// thread to arrive (an OpenMP parallel-for ends in a barrier): a worker that
// the OS has not scheduled yet simply finds no items left, which keeps a call
// from losing a scheduler tick (~4 ms) when the machine is oversubscribed.
// After a job, workers spin for up to 200 us, then sleep on a condition variable
// until the next one - but only while jobs come that close together (a benchmark's
// back-to-back calls): when the gap before this job was longer, they sleep at once.
// Inside a model, other pools (torch's OpenMP, BLAS) run between two attention calls
// (~1.3 ms per layer for SmolLM2 on 2 cores), and a helper spinning there took a core
// from them: SmolLM2's decode step on a 2-core Xeon took ~45.5 ms with a fixed spin, ~40.5 ms so.
// One job at a time: a concurrent caller (another Python thread; the GIL is
// released) that finds the pool busy runs its items itself.
// At most one helper per CPU the process may use besides the caller: more threads than
// CPUs only take turns (the split layout still follows the requested thread count).
// After fork() the child gets a fresh pool (pool(), below): the parent's workers do not
// exist there, and its mutexes and condition variable may be in any state.
// An item that throws (on any thread) still counts as done; run() waits for every item and
// then rethrows the first exception on the caller. Rethrowing early would free the job while
// workers still run it, and an exception escaping a worker would end the process.
// Waking sleeping helpers costs the caller a futex wake and the helpers their wake-up, which on a
// small VM outweighed the help for calls of up to a few hundred microseconds (docs/simd.md,
// "Threads"). So a job after idle time that finds every helper it needs asleep, and whose caller
// gave its size (bytes), is run by the caller alone or with the helpers woken, whichever has been
// faster for jobs of that size (per power-of-two size class, both ways tried at first and now and
// then after). The items are the same either way, so the results do not change.
class ThreadPool {
public:
    template <typename F>
    void run(int64_t n, int threads, F& fn, int64_t size_bytes = 0)
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
        const bool after_idle = start - last_end_ns_ > kSpinNs;
        WakeChoice* choice = nullptr;  // set when this job is one the wake choice learns from
        if (size_bytes > 0 && after_idle && sleeping_.load() >= helpers) {
            choice = &wake_choice(size_bytes);
            if (!choice->wake_next()) {
                std::exception_ptr error;
                try {
                    run_here(n, fn);
                } catch (...) {
                    error = std::current_exception();
                }
                last_end_ns_ = now_ns();
                if (error) std::rethrow_exception(error);  // a failed call teaches the choice nothing
                choice->learn(false, (double)(last_end_ns_ - start) / (double)size_bytes);
                return;
            }
        }
        spin_after_job_.store(!after_idle, std::memory_order_relaxed);
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
            std::lock_guard<std::mutex> lk(mu_);
            cv_.notify_all();
        }
        work();
        while (done_.load(std::memory_order_acquire) < n) pause();
        last_end_ns_ = now_ns();
        if (choice && !failed_.load(std::memory_order_relaxed))
            choice->learn(true, (double)(last_end_ns_ - start) / (double)size_bytes);
        // error_ was written before its item's done_ release, and done_ was read with acquire.
        if (failed_.load(std::memory_order_relaxed)) std::rethrow_exception(std::exchange(error_, nullptr));
    }

    // The jobs of size_bytes' size class run alone / with sleeping helpers woken (a testing hook).
    void wake_runs(int64_t size_bytes, int64_t* alone, int64_t* woken)
    {
        std::lock_guard<std::mutex> lk(run_mu_);
        const WakeChoice& c = wake_choice(size_bytes);
        *alone = c.runs[0];
        *woken = c.runs[1];
    }

private:
    WakeChoice& wake_choice(int64_t size_bytes)  // size_bytes > 0: its power-of-two class
    {
        return wake_choices_[63 - __builtin_clzll((unsigned long long)size_bytes)];
    }

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
    WakeChoice wake_choices_[64];  // by floor(log2(size_bytes)); only run() uses them, under run_mu_
    std::exception_ptr error_;  // the first item's exception; written by the thread that set failed_
    void (*call_)(void*, int64_t) = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    int max_workers_ = 0;
    const int max_threads_ = std::max<int>(1, kvarn_default_threads());
};

// Never destroyed: workers blocked in a wait at process exit are simply ended. In a
// fork()ed child the handler below, run by the only thread there before anything else,
// replaces the pool; the parent's is leaked on purpose (its threads do not exist in the
// child, so its std::thread objects can never be joined or destroyed).
std::atomic<ThreadPool*> g_pool{nullptr};

void new_pool_after_fork() { g_pool.store(new ThreadPool); }

ThreadPool& pool()
{
    static const bool registered = [] {
        g_pool.store(new ThreadPool);
        return pthread_atfork(nullptr, nullptr, new_pool_after_fork) == 0;
    }();
    (void)registered;  // fails only without memory (ENOMEM); nothing better to do then
    return *g_pool.load();
}

template <typename F>
int guarded(F&& body)
{
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return KVARN_ERR_INTERNAL;
    } catch (...) {
        return KVARN_ERR_INTERNAL;
    }
}

// pool().run as a status: an item's exception (only an allocation failure) is KVARN_ERR_INTERNAL.
template <typename F>
int run_items(int64_t n, int threads, F& fn)
{
    return guarded([&] {
        pool().run(n, threads, fn);
        return (int)KVARN_OK;
    });
}

// A sequence is cut into units for splitting: the sink in chunks of
// kSinkChunk tokens, then one unit per tile, then the tail as one unit. An fp16
// cache (everything in the sink) therefore splits as well as a quantised one.
constexpr int64_t kSinkChunk = 128;

// The most softmax state an attend call's splits may hold (floats: 64 MiB).
constexpr size_t kSplitStateBudgetFloats = size_t(16) << 20;

// How an attend call splits each (sequence, kv head) into work items. Threads take items as they finish, so more
// items even out an item count that is not a multiple of the threads (2 per thread gave 9 items to 4 threads at
// head_dim 64: three rounds for 2.25 rounds' work) and threads that run at different speeds (a VM's vCPUs sharing
// cores, hybrid CPUs); but each split costs a little (its query prep, a cold first record, its share of the
// merge). So: about kItemsPerThread items per thread where every split keeps >= kFineSplitUnits units (2,048
// tokens), and at least kMinItemsPerThread where every split keeps >= kMinSplitUnits. On the lent 16-vCPU Xeon at
// 32K tokens, headline shape, 8 and 16 threads: 0.79-0.91 of the time of 2 per thread in two device calls
// (RESULTS section 2, fortieth session).
constexpr int64_t kItemsPerThread = 8, kFineSplitUnits = 16;
constexpr int64_t kMinItemsPerThread = 2, kMinSplitUnits = 4;

// One unit of attention work: a KV head of one sequence, over a contiguous
// range of its units.
struct WorkItem {
    int32_t seq, kv_head, split, n_splits;
    int64_t unit_begin, unit_end;
};

int64_t sink_units(const kvarn_cache_view& c) { return (c.sink_len + kSinkChunk - 1) / kSinkChunk; }
int64_t total_units(const kvarn_cache_view& c) { return sink_units(c) + c.num_tiles + (c.tail_len > 0 ? 1 : 0); }

}  // namespace

extern "C" {

int32_t kvarn_default_threads(void)
{
#if defined(__linux__)
    // CPUs this process may run on (respects taskset/cgroup affinity).
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    // Elsewhere (macOS has no affinity masks), or past glibc's 1024-CPU set: the logical CPUs.
    const unsigned h = std::thread::hardware_concurrency();
    return h ? (int32_t)h : 1;
}

int kvarn_hadamard_f32(float* x, int64_t rows, int32_t head_dim)
{
    // x may be NULL for no rows, as any empty part of a view
    if ((!x && rows) || !kvarn_head_dim_supported(head_dim) || !fits(rows, (uint64_t)head_dim * sizeof(float)) ||
        !aligned(x, 4))
        return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    if (!rows) return KVARN_OK;
    kt->hadamard_f32(x, rows, head_dim);
    return KVARN_OK;
}

int kvarn_hadamard_f64(double* x, int64_t rows, int32_t head_dim)
{
    if ((!x && rows) || !kvarn_head_dim_supported(head_dim) || !fits(rows, (uint64_t)head_dim * sizeof(double)) ||
        !aligned(x, 8))
        return KVARN_ERR_ARGUMENT;
    if (!kvarn::active_kernels()) return KVARN_ERR_ISA;  // scalar-only, but a kernel call like the others
    if (!rows) return KVARN_OK;
    kvarn::hadamard_f64_rows(x, rows, head_dim);
    return KVARN_OK;
}

int kvarn_quantize_tiles_typed(const void* k, const void* v, int32_t input_type, int64_t n_tiles, int32_t kbits,
                               int32_t vbits, int32_t group, int32_t head_dim, int32_t iters, uint8_t* records,
                               int32_t num_threads, int64_t* bad_tile)
{
    // No tiles: NULL buffers allowed (as kvarn_hadamard_f32 takes them for no rows).
    if (((!k || !v || !records) && n_tiles != 0) || n_tiles < 0 || iters < 0 || iters > KVARN_MAX_SINKHORN_ITERS ||
        !format_ok(kbits, vbits, group, head_dim) || !tiles_fit(n_tiles, kbits, vbits, group, head_dim) ||
        (input_type != KVARN_INPUT_F32 && input_type != KVARN_INPUT_F16 && input_type != KVARN_INPUT_F32_AS_F16) ||
        !threads_ok(num_threads) || !aligned(records, 2) || !aligned(bad_tile, alignof(int64_t)) ||
        !aligned(k, input_type == KVARN_INPUT_F16 ? 2 : 4) || !aligned(v, input_type == KVARN_INPUT_F16 ? 2 : 4))
        return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    const TileFormat fmt{kbits, vbits, group, head_dim};
    const size_t rec_bytes = record_layout(fmt).total;
    const size_t tile_elems = (size_t)group * head_dim;
    const size_t tile_bytes = tile_elems * (input_type == KVARN_INPUT_F16 ? 2 : 4);
    const char* k_bytes = static_cast<const char*>(k);
    const char* v_bytes = static_cast<const char*>(v);
    std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
    // Two items per tile, its K and its V half (disjoint bytes of the record): a few tiles
    // (one per kv head when a tile completes during decoding) then still fill every thread.
    auto body = [&](int64_t item) {
        const int64_t i = item / 2;
        const int part = item % 2 ? kvarn::kQuantizeV : kvarn::kQuantizeK;
        // The quantiser reads only the part's input, so src serves as k and v alike.
        const char* src = (part == kvarn::kQuantizeK ? k_bytes : v_bytes) + i * tile_bytes;
        if (kt->quantize_tile(src, src, input_type, fmt, iters, records + i * rec_bytes, part)) {
            int64_t cur = first_bad.load();
            while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
            }
        }
    };
    const int rc = run_items(2 * n_tiles, resolve_threads(num_threads), body);
    if (rc != KVARN_OK) return rc;
    if (first_bad.load() != std::numeric_limits<int64_t>::max()) {
        if (bad_tile) *bad_tile = first_bad.load();
        return KVARN_ERR_OVERFLOW;
    }
    return KVARN_OK;
}

int kvarn_quantize_tiles(const float* k, const float* v, int64_t n_tiles, int32_t kbits, int32_t vbits,
                         int32_t group, int32_t head_dim, int32_t iters, uint8_t* records, int32_t num_threads,
                         int64_t* bad_tile)
{
    return kvarn_quantize_tiles_typed(k, v, KVARN_INPUT_F32, n_tiles, kbits, vbits, group, head_dim, iters, records,
                                      num_threads, bad_tile);
}

int kvarn_dequantize_tiles(const uint8_t* records, int64_t n_tiles, int32_t kbits, int32_t vbits, int32_t group,
                           int32_t head_dim, float* k, float* v)
{
    if (((!records || !k || !v) && n_tiles != 0) || n_tiles < 0 || !format_ok(kbits, vbits, group, head_dim) ||
        !tiles_fit(n_tiles, kbits, vbits, group, head_dim) || !aligned(k, 4) || !aligned(v, 4))
        return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    const int G = group, D = head_dim;
    const kvarn_record_layout L = kvarn_layout(kbits, vbits, group, head_dim);
    const size_t krow = kvarn_packed_row_bytes(G, kbits), vrow = kvarn_packed_row_bytes(D, vbits);
    auto code = [](const uint8_t* row, int i, int bits) {
        const int per_byte = 8 / bits;
        return (float)((row[i / per_byte] >> ((i % per_byte) * bits)) & ((1u << bits) - 1u));
    };
    auto f16 = [](const uint8_t* base, size_t off, int i) {
        uint16_t h;
        std::memcpy(&h, base + off + 2 * (size_t)i, 2);
        return kvarn::half_to_float(h);
    };
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = records + tile * L.total;
        float* kout = k + tile * (int64_t)G * D;
        float* vout = v + tile * (int64_t)G * D;
        for (int t = 0; t < G; ++t)
            for (int d = 0; d < D; ++d) {
                kout[t * D + d] =
                    (code(rec + L.k_codes + d * krow, t, kbits) * f16(rec, L.ka, d) + f16(rec, L.kz, d)) *
                    f16(rec, L.kt, t);
                vout[t * D + d] =
                    (code(rec + L.v_codes + t * vrow, d, vbits) * f16(rec, L.va, t) + f16(rec, L.vz, t)) *
                    f16(rec, L.vc, d);
            }
        // Back to the original frame: H is its own inverse.
        kt->hadamard_f32(kout, G, D);
        kt->hadamard_f32(vout, G, D);
    }
    return KVARN_OK;
}

static bool view_ok(const kvarn_cache_view& c, int32_t num_q_heads)
{
    if (c.num_kv_heads <= 0 || num_q_heads % c.num_kv_heads != 0) return false;
    if (!kvarn_head_dim_supported(c.head_dim)) return false;
    if (c.sink_len < 0 || c.num_tiles < 0 || c.tail_len < 0) return false;
    const int64_t Hk = c.num_kv_heads, D = c.head_dim;
    if (c.sink_len > 0 && (!c.sink_k || !c.sink_v || !aligned(c.sink_k, 2) || !aligned(c.sink_v, 2) || c.sink_row_stride < D ||
                           !span_fits(Hk, c.sink_head_stride, c.sink_len, c.sink_row_stride, D, 2)))
        return false;
    if (c.tail_len > 0 && (!c.tail_k || !c.tail_v || !aligned(c.tail_k, 2) || !aligned(c.tail_v, 2) || c.tail_row_stride < D ||
                           !span_fits(Hk, c.tail_head_stride, c.tail_len, c.tail_row_stride, D, 2)))
        return false;
    if (c.num_tiles > 0) {
        if (!c.records || !format_ok(c.kbits, c.vbits, c.group, c.head_dim)) return false;
        const int64_t rec = (int64_t)kvarn_layout(c.kbits, c.vbits, c.group, c.head_dim).total;
        if (c.record_tile_stride < rec || !aligned(c.records, 2) || c.record_tile_stride % 2 || c.record_head_stride % 2 ||
            !span_fits(Hk, c.record_head_stride, c.num_tiles, c.record_tile_stride, rec, 1))
            return false;
    }
    // Each length is now below PTRDIFF_MAX / 2: the sum cannot overflow.
    if (c.sink_len + c.num_tiles + c.tail_len == 0) return false;
    return true;
}

// The tokens a multi-token call hides from its earlier queries (the sequence's last n_tokens - 1) must
// lie in the view's full-precision end: the tail, and the sink too while no tile follows it; and the
// first query must see a token (with a tile there is one before the tail).
static bool hidden_tokens_fp16(const kvarn_cache_view& c, int32_t n_tokens)
{
    const int64_t fp16_end = c.tail_len + (c.num_tiles == 0 ? c.sink_len : 0);
    return n_tokens - 1 <= fp16_end && (c.num_tiles > 0 || n_tokens <= fp16_end);
}

int kvarn_attend(const kvarn_cache_view* caches, int32_t batch, const float* q, int32_t num_q_heads, float scale,
                 float* out, int32_t num_threads)
{
    return kvarn_attend_tokens(caches, batch, 1, q, num_q_heads, scale, out, num_threads);
}

int kvarn_attend_tokens(const kvarn_cache_view* caches, int32_t batch, int32_t n_tokens, const float* q,
                        int32_t num_q_heads, float scale, float* out, int32_t num_threads)
{
    if (!caches || !q || !out || batch <= 0 || n_tokens <= 0 || num_q_heads <= 0 || !std::isfinite(scale) ||
        !threads_ok(num_threads) || !aligned(q, 4) || !aligned(out, 4))
        return KVARN_ERR_ARGUMENT;
    // Rows of a call (n_tokens * num_q_heads) fit an int, and so do a group's; the head_dim bound keeps the byte
    // count below 2^64 for fits() (views with another head_dim are refused below anyway).
    const int D = caches[0].head_dim;
    if (!kvarn_head_dim_supported(D) || (int64_t)n_tokens * num_q_heads > INT32_MAX ||
        !fits(batch, (uint64_t)n_tokens * (uint64_t)num_q_heads * (uint64_t)D * sizeof(float)))
        return KVARN_ERR_ARGUMENT;
    for (int32_t b = 0; b < batch; ++b)
        if (!view_ok(caches[b], num_q_heads) || caches[b].head_dim != D ||
            caches[b].num_kv_heads != caches[0].num_kv_heads || !hidden_tokens_fp16(caches[b], n_tokens))
            return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;

    return guarded([&]() -> int {
        const int Hk = caches[0].num_kv_heads;
        const int group_heads = num_q_heads / Hk;  // query heads per kv head, per token
        // A (sequence, kv head) group's query rows: token-major, row r = token r / group_heads, head r % group_heads.
        const int n_q = n_tokens * group_heads;
        const int threads = resolve_threads(num_threads);
        // q / out offset (floats) of row r of group (seq, kv_head): [batch][n_tokens][num_q_heads][D]
        auto row_at = [&](int64_t seq, int64_t kv_head, int r) {
            return (((size_t)seq * n_tokens + (size_t)(r / group_heads)) * num_q_heads + (size_t)kv_head * group_heads +
                    (size_t)(r % group_heads)) * D;
        };

        // Split long caches across threads (flash-decoding): work items per thread as the constants
        // above say, so that dynamic scheduling can even out, never fewer than
        // 4 units (tiles or 128-token fp16 chunks) per split, and never more than the state
        // budget below allows (a large num_threads over many query heads would otherwise
        // ask for gigabytes; the cap depends on the arguments alone, so outputs stay the
        // same for the same num_threads on every machine).
        // Items of one (sequence, kv head) group g = seq * Hk + head are contiguous, from group_first[g];
        // group_left[g] counts the ones not finished yet.
        // Per item: m[n_q], l[n_q], acc_orig[n_q*D], acc_rot[n_q*D], then its group's queries
        // scaled [n_q*D] and rotated [n_q*D] (each item prepares its own: no serial pass, and a
        // split's copy costs a few rows). Left uninitialised: every item sets what it reads.
        const size_t state_floats = (size_t)n_q * (2 + 4 * (size_t)D);
        std::vector<WorkItem> items;
        const int64_t heads_total = (int64_t)batch * Hk;
        const int64_t max_splits = std::max<int64_t>(1, (int64_t)(kSplitStateBudgetFloats / ((size_t)heads_total * state_floats)));
        std::unique_ptr<int64_t[]> group_first(new int64_t[heads_total]);
        std::unique_ptr<std::atomic<int32_t>[]> group_left(new std::atomic<int32_t>[heads_total]);
        auto splits_for = [&](int64_t items_per_thread) {  // per group, for that many items per thread
            return (items_per_thread * threads + heads_total - 1) / heads_total;
        };
        int64_t bytes = 0;  // the bytes the call reads, for the pool's choice whether waking sleeping helpers pays
        for (int32_t b = 0; b < batch; ++b) {
            const kvarn_cache_view& c = caches[b];
            const int64_t rec = c.num_tiles > 0 ? (int64_t)kvarn_layout(c.kbits, c.vbits, c.group, D).total : 0;
            bytes += (int64_t)Hk * ((c.sink_len + c.tail_len) * 4 * (int64_t)D + c.num_tiles * rec);
            const int64_t U = total_units(c);
            // (one thread has nothing to even out: its items would only add their overhead)
            const int64_t fine = threads > 1 ? std::min<int64_t>(splits_for(kItemsPerThread), U / kFineSplitUnits) : 0;
            const int64_t coarse = std::min<int64_t>(splits_for(kMinItemsPerThread), U / kMinSplitUnits);
            const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(std::max(fine, coarse), max_splits));
            for (int h = 0; h < Hk; ++h) {
                group_first[(int64_t)b * Hk + h] = (int64_t)items.size();
                group_left[(int64_t)b * Hk + h].store((int32_t)splits, std::memory_order_relaxed);
                for (int64_t s = 0; s < splits; ++s)
                    items.push_back({b, h, (int32_t)s, (int32_t)splits, U * s / splits, U * (s + 1) / splits});
            }
        }
        const int64_t n_items = (int64_t)items.size();
        // Each item's state starts on its own cache line: items that run side by side on two threads are mostly
        // neighbours, and one's per-tile writes of l (and m) shared a line with the other's last query row, read
        // every tile, so the line moved between the cores twice a record.
        constexpr size_t kLineFloats = 64 / sizeof(float);
        const size_t state_stride = (state_floats + kLineFloats - 1) / kLineFloats * kLineFloats;
        if (items.size() >= (size_t)PTRDIFF_MAX / sizeof(float) / state_stride) return (int)KVARN_ERR_ARGUMENT;
        std::unique_ptr<float[]> state_buffer(new float[(items.size() + 1) * state_stride]);  // + 1: room to align
        const size_t past_line = reinterpret_cast<uintptr_t>(state_buffer.get()) / sizeof(float) % kLineFloats;
        float* const states = state_buffer.get() + (kLineFloats - past_line) % kLineFloats;
        // The rotated frame serves only the quantised tiles: an all-fp16 batch (the FP16Cache,
        // short sequences still in their sink) needs no Hadamard and no rotated sum.
        bool any_tiles = false;
        for (int32_t b = 0; b < batch; ++b) any_tiles = any_tiles || caches[b].num_tiles > 0;
        std::unique_ptr<float[]> rot_sum(any_tiles ? new float[(size_t)batch * n_tokens * num_q_heads * D] : nullptr);
        // Set when an output is not finite: queries large enough to overflow float32 over keys decoded
        // from imported records (appended keys cannot, within the query bound Python checks).
        std::atomic<bool> nonfinite{false};

        // Merges the splits of group g into out (and the rotated part, rotated back), run by the
        // thread that finishes the group's last item: the merge needs no serial pass either.
        auto merge_group = [&](int64_t g) {
            const int64_t first = group_first[g];
            const WorkItem& w0 = items[first];
            const int64_t n = w0.n_splits;
            for (int h = 0; h < n_q; ++h) {
                const size_t row = row_at(w0.seq, w0.kv_head, h);
                float m = -std::numeric_limits<float>::infinity();
                for (int64_t s = 0; s < n; ++s) m = std::max(m, states[(first + s) * state_stride + h]);
                float l = 0.0f;
                float* o = out + row;
                float* r = any_tiles ? rot_sum.get() + row : nullptr;
                std::fill(o, o + D, 0.0f);
                if (r) std::fill(r, r + D, 0.0f);
                for (int64_t s = 0; s < n; ++s) {
                    const float* base = states + (first + s) * state_stride;
                    if (base[n_q + h] == 0.0f) continue;  // split saw no tokens for this head
                    const float wgt = std::exp(base[h] - m);
                    l += wgt * base[n_q + h];
                    const float* ao = base + 2 * n_q + (size_t)h * D;
                    for (int d = 0; d < D; ++d) o[d] += wgt * ao[d];
                    if (r) {
                        const float* ar = base + 2 * n_q + (size_t)n_q * D + (size_t)h * D;
                        for (int d = 0; d < D; ++d) r[d] += wgt * ar[d];
                    }
                }
                const float inv = 1.0f / l;
                for (int d = 0; d < D; ++d) o[d] *= inv;
                if (r)
                    for (int d = 0; d < D; ++d) r[d] *= inv;
            }
            bool finite = true;
            for (int i = 0; i < n_tokens; ++i) {  // each token's group_heads rows lie together
                const size_t row0 = row_at(w0.seq, w0.kv_head, i * group_heads), rows = (size_t)group_heads * D;
                if (any_tiles) {
                    float* r = rot_sum.get() + row0;
                    kt->hadamard_f32(r, group_heads, D);
                    for (size_t j = 0; j < rows; ++j) out[row0 + j] += r[j];
                }
                for (size_t j = 0; j < rows; ++j) finite = finite && std::isfinite(out[row0 + j]);
            }
            if (!finite) nonfinite.store(true, std::memory_order_relaxed);
        };

        auto body = [&](int64_t i) {
            const WorkItem& w = items[i];
            const kvarn_cache_view& c = caches[w.seq];
            float* base = states + i * state_stride;
            SoftmaxState st{base, base + n_q, base + 2 * n_q, base + 2 * n_q + (size_t)n_q * D};
            float* q_scaled = base + 2 * n_q + 2 * (size_t)n_q * D;
            float* q_rot = q_scaled + (size_t)n_q * D;
            std::fill(st.m, st.m + n_q, -std::numeric_limits<float>::infinity());
            std::fill(st.l, st.l + n_q, 0.0f);
            std::fill(st.acc_orig, st.acc_orig + 2 * (size_t)n_q * D, 0.0f);
            for (int r = 0; r < n_q; ++r) {
                const float* src = q + row_at(w.seq, w.kv_head, r);
                for (int d = 0; d < D; ++d) q_scaled[(size_t)r * D + d] = src[d] * scale;
            }
            // Token i's query sees all but the sequence's last n_tokens - 1 - i tokens: those come off the
            // tail, then off the sink (hidden_tokens_fp16). The fp16 parts are attended per token where a
            // token's cut falls in them, else for all rows at once (always when n_tokens is 1).
            auto hidden = [&](int i, bool in_tail) {
                const int64_t h = n_tokens - 1 - i, from_tail = std::min<int64_t>(h, c.tail_len);
                return in_tail ? from_tail : h - from_tail;
            };
            auto token_state = [&](int i) {
                const size_t r0 = (size_t)i * group_heads;
                return SoftmaxState{st.m + r0, st.l + r0, st.acc_orig + r0 * D, st.acc_rot + r0 * D};
            };
            // The fp16 tokens [t0, t1) of a part whose last `hidden(i)` tokens token i does not see (end: its length).
            auto attend_fp16_part = [&](const uint16_t* k, const uint16_t* v, int64_t row_stride, int64_t t0, int64_t t1,
                                        int64_t end, bool in_tail) {
                const int64_t off = w.kv_head * (in_tail ? c.tail_head_stride : c.sink_head_stride) + t0 * row_stride;
                if (std::min(t1, end - hidden(0, in_tail)) == t1) {  // token 0 hides the most: no cut in [t0, t1)
                    kt->attend_dense_f16(q_scaled, n_q, D, k + off, v + off, t1 - t0, row_stride, st);
                    return;
                }
                for (int i = 0; i < n_tokens; ++i) {
                    const int64_t t1_i = std::min(t1, end - hidden(i, in_tail));
                    if (t1_i > t0)
                        kt->attend_dense_f16(q_scaled + (size_t)i * group_heads * D, group_heads, D, k + off, v + off,
                                             t1_i - t0, row_stride, token_state(i));
                }
            };
            const int64_t su = sink_units(c);
            // Sink chunks [unit_begin, min(unit_end, su)).
            const int64_t s0 = std::min(w.unit_begin, su), s1 = std::min(w.unit_end, su);
            if (s1 > s0)
                attend_fp16_part(c.sink_k, c.sink_v, c.sink_row_stride, s0 * kSinkChunk,
                                 std::min(s1 * kSinkChunk, c.sink_len), c.sink_len, false);
            // Tiles [unit_begin - su, unit_end - su) clipped to [0, num_tiles).
            const int64_t tb = std::max<int64_t>(w.unit_begin - su, 0);
            const int64_t te = std::min<int64_t>(w.unit_end - su, c.num_tiles);
            if (te > tb) {
                std::memcpy(q_rot, q_scaled, (size_t)n_q * D * sizeof(float));
                kt->hadamard_f32(q_rot, n_q, D);
                const TileFormat fmt{c.kbits, c.vbits, c.group, c.head_dim};
                kt->attend_tiles(q_rot, n_q, fmt, c.records + w.kv_head * c.record_head_stride + tb * c.record_tile_stride,
                                 te - tb, c.record_tile_stride, st);
            }
            if (c.tail_len > 0 && w.unit_end == total_units(c))
                attend_fp16_part(c.tail_k, c.tail_v, c.tail_row_stride, 0, c.tail_len, c.tail_len, true);
            // The last of the group's items to finish merges it (acq_rel: it sees the others' states).
            const int64_t g = (int64_t)w.seq * Hk + w.kv_head;
            if (group_left[g].fetch_sub(1, std::memory_order_acq_rel) == 1) merge_group(g);
        };
        pool().run(n_items, threads, body, bytes);
        return nonfinite.load(std::memory_order_relaxed) ? (int)KVARN_ERR_OVERFLOW : (int)KVARN_OK;
    });
}

}  // extern "C"

// The scans' helpers (C++: overloads and templates).
// kvarn::float_to_half with its common case inline: a normal half that does not overflow, rounded
// to nearest even by adding the carry ((rem + odd) > half-ulp) to the truncated bits. Static here, not
// an inline in kernels.h: the ISA files include that header, and the linker could pick their copy of
// an inline function (with AVX-512 in it) for this baseline file. The out-of-line call per element
// made a 4096-element store ~2.6x slower.
static inline uint16_t to_half_bits(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx - 0x38800000u < 0x477ff000u - 0x38800000u) {  // [2^-14, 65520): a normal half after rounding
        const uint32_t q = (absx - 0x38000000u) >> 13, rem = absx & 0x1fffu;
        return (uint16_t)(sign | (q + ((rem + (q & 1u)) > 0x1000u ? 1u : 0u)));
    }
    return kvarn::float_to_half(f);  // subnormals, zeros, overflow, Inf and NaN
}

// |x|'s bit pattern (sign cleared) as a signed int: IEEE order is integer order there, and NaNs lie
// above +Inf, so the integer max of these finds the maximum, any Inf and any NaN at once.
static inline int32_t abs_bits(const float* p)
{
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return (int32_t)(bits & 0x7fffffffu);
}

static inline int32_t abs_bits(const uint16_t* p) { return (int32_t)(*p & 0x7fffu); }  // binary16 alike

// The largest abs_bits over a strided [n0][n1][n2] array (0 when empty).
template <typename T>
static int32_t max_abs_bits(const T* x, const int64_t n[3], const int64_t s[3])
{
    // Contiguous axes scanned as one row (a prompt's [H, n, D]: one long loop, not H·n short ones).
    const int64_t s0 = s[0], s1 = s[1], s2 = s[2];
    int64_t rows0 = n[0], rows1 = n[1], len = n[2];
    if (s2 == 1 && s1 == n[2]) {
        len = n[1] * n[2], rows1 = 1;
        if (s0 == len) len *= n[0], rows0 = 1;
    }
    int32_t top = 0;
    for (int64_t i = 0; i < rows0; ++i)
        for (int64_t j = 0; j < rows1; ++j) {
            const T* row = x + i * s0 + j * s1;
            int32_t m = top;  // a local maximum: the unit-stride loop vectorises (SSE2's signed compare)
            if (s2 == 1) {
                for (int64_t t = 0; t < len; ++t) m = std::max(m, abs_bits(row + t));
            } else {
                for (int64_t t = 0; t < len; ++t) m = std::max(m, abs_bits(row + t * s2));
            }
            top = m;
        }
    return top;
}

// out[i][j][t] = convert(x[i][j][t]), both strided, in x's axes.
template <typename T, typename Convert>
static void copy_strided(const T* x, const int64_t n[3], const int64_t s[3], uint16_t* out, const int64_t o[3],
                         Convert convert)
{
    // Locals, not n[], s[], o[], in the loops: read through the arrays, a 1024-element store ran ~15 % slower.
    const int64_t n0 = n[0], n1 = n[1], n2 = n[2], s0 = s[0], s1 = s[1], s2 = s[2], o0 = o[0], o1 = o[1], o2 = o[2];
    for (int64_t i = 0; i < n0; ++i)
        for (int64_t j = 0; j < n1; ++j) {
            const T* row = x + i * s0 + j * s1;
            uint16_t* dst = out + i * o0 + j * o1;
            for (int64_t t = 0; t < n2; ++t) dst[t * o2] = convert(row[t * s2]);
        }
}

// The arguments both scans share; KVARN_OK with *max_abs = 0 for an empty array, -1 to go on.
static int scan_arguments(const void* x, size_t elem, const int64_t shape[3], const int64_t x_strides[3],
                          float* max_abs, const uint16_t* out, const int64_t out_strides[3])
{
    if (!shape || !x_strides || !max_abs || shape[0] < 0 || shape[1] < 0 || shape[2] < 0 || (out && !out_strides))
        return KVARN_ERR_ARGUMENT;
    if (shape[0] == 0 || shape[1] == 0 || shape[2] == 0) {
        *max_abs = 0.0f;
        return KVARN_OK;
    }
    if (!x || !aligned(x, elem) || (out && !aligned(out, 2))) return KVARN_ERR_ARGUMENT;
    return -1;
}

extern "C" {

int kvarn_scan_f32(const float* x, const int64_t shape[3], const int64_t x_strides[3], float* max_abs,
                   uint16_t* out, const int64_t out_strides[3], float f16_limit)
{
    if (!(f16_limit >= 0.0f && f16_limit <= 65504.0f)) return KVARN_ERR_ARGUMENT;
    const int rc = scan_arguments(x, 4, shape, x_strides, max_abs, out, out_strides);
    if (rc != -1) return rc;
    float largest;
    const uint32_t top_bits = (uint32_t)max_abs_bits(x, shape, x_strides);
    std::memcpy(&largest, &top_bits, 4);
    *max_abs = largest;  // a NaN stays a NaN; Inf stays Inf
    if (out && largest <= f16_limit)
        copy_strided(x, shape, x_strides, out, out_strides, [](float f) { return to_half_bits(f); });
    return KVARN_OK;
}

int kvarn_scan_f16(const uint16_t* x, const int64_t shape[3], const int64_t x_strides[3], float* max_abs,
                   uint16_t* out, const int64_t out_strides[3])
{
    const int rc = scan_arguments(x, 2, shape, x_strides, max_abs, out, out_strides);
    if (rc != -1) return rc;
    const int32_t top = max_abs_bits(x, shape, x_strides);
    *max_abs = kvarn::half_to_float((uint16_t)top);  // exact; a NaN pattern gives a NaN, 0x7c00 Inf
    if (!out || top >= 0x7c00) return KVARN_OK;
    if (x_strides[2] == 1 && out_strides[2] == 1) {  // rows contiguous in both (tokens into a cache's slots): a copy per row
        for (int64_t i = 0; i < shape[0]; ++i)
            for (int64_t j = 0; j < shape[1]; ++j)
                std::memcpy(out + i * out_strides[0] + j * out_strides[1], x + i * x_strides[0] + j * x_strides[1],
                            (size_t)shape[2] * 2);
    } else {
        copy_strided(x, shape, x_strides, out, out_strides, [](uint16_t h) { return h; });
    }
    return KVARN_OK;
}

int kvarn_testing_pool_fault(int64_t n_items, int32_t num_threads, int32_t fault_on_helper, int64_t* finished,
                             int32_t* faulted)
{
    if (n_items <= 0 || !finished || !faulted || !threads_ok(num_threads)) return KVARN_ERR_ARGUMENT;
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<int64_t> done{0};
    std::atomic<bool> thrown{false};
    auto body = [&](int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));  // long enough for the helpers to join
        if ((std::this_thread::get_id() != caller) == (fault_on_helper != 0) && !thrown.exchange(true))
            throw std::runtime_error("kvarn_testing_pool_fault");
        done.fetch_add(1);
    };
    const int rc = run_items(n_items, resolve_threads(num_threads), body);
    // Read when run() has returned: an early return would show items still unfinished.
    *finished = done.load();
    *faulted = thrown.load() ? 1 : 0;
    return rc;
}

int kvarn_testing_wake_choice(int64_t n_jobs, const double* alone_ns_per_byte, const double* woken_ns_per_byte,
                              int8_t* woke)
{
    if (n_jobs < 0 || (n_jobs > 0 && (!alone_ns_per_byte || !woken_ns_per_byte || !woke))) return KVARN_ERR_ARGUMENT;
    WakeChoice choice;
    for (int64_t i = 0; i < n_jobs; ++i) {
        const bool w = choice.wake_next();
        woke[i] = w ? 1 : 0;
        choice.learn(w, w ? woken_ns_per_byte[i] : alone_ns_per_byte[i]);
    }
    return KVARN_OK;
}

int kvarn_testing_pool_wake_runs(int64_t size_bytes, int64_t* alone, int64_t* woken)
{
    if (size_bytes <= 0 || !alone || !woken) return KVARN_ERR_ARGUMENT;
    return guarded([&] {
        pool().wake_runs(size_bytes, alone, woken);
        return (int)KVARN_OK;
    });
}

}  // extern "C"
