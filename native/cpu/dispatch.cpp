// ISA detection and the active kernel table. Detection runs once, at first use:
// cpuid says what the CPU has, XGETBV says whether the OS saves the wider
// registers. KVARN_ISA=scalar|avx2|avx512 forces one; an unknown or
// unsupported name is an error (kvarn_isa_error), never a silent fallback.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <pthread.h>

#include "dispatch.h"
#include "kvarn/kvarn.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <cpuid.h>
#define KVARN_X86 1
#endif

namespace kvarn {
namespace {

struct CpuFeatures {
    bool avx2 = false;    // AVX2 + FMA + F16C with YMM state enabled by the OS
    bool avx512 = false;  // AVX-512 F/BW/VL/DQ with ZMM state enabled by the OS
    bool avx512_vnni = false;
    bool avx_vnni = false;  // AVX-VNNI: VEX-encoded vpdpwssd on ymm (cpuid 7.1 eax bit 4)
    bool avx512_vbmi = false;  // AVX-512 VBMI: vpermb / vpermt2b (cpuid 7.0 ecx bit 1)
};

#ifdef KVARN_X86
uint64_t read_xcr0()
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

CpuFeatures detect()
{
    CpuFeatures f;
#ifdef KVARN_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12), f16c = c & (1u << 29);
    if (!osxsave || !avx) return f;
    const uint64_t xcr0 = read_xcr0();
    const bool ymm_state = (xcr0 & 0x6) == 0x6;
    const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
    if (__get_cpuid_max(0, nullptr) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned leaf7_subleaves = a;  // highest valid subleaf of leaf 7
    const bool avx2 = b & (1u << 5);
    const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
               avx512vl = b & (1u << 31), vnni = c & (1u << 11), vbmi = c & (1u << 1);
    f.avx2 = ymm_state && avx2 && fma && f16c;
    f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl;
    f.avx512_vnni = f.avx512 && vnni;
    f.avx512_vbmi = f.avx512 && vbmi;
    if (leaf7_subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f.avx_vnni = f.avx2 && (a & (1u << 4));
    }
#endif
    return f;
}

const CpuFeatures& features()
{
    static const CpuFeatures f = detect();
    return f;
}

// Full table for an ISA: its own entries, missing ones from the level below.
KernelTable merged(const KernelTable* top, const KernelTable& below)
{
    KernelTable t = below;
    if (!top) return t;
    t.name = top->name;
    if (top->hadamard_f32) t.hadamard_f32 = top->hadamard_f32;
    if (top->quantize_tile) t.quantize_tile = top->quantize_tile;
    if (top->attend_tiles) t.attend_tiles = top->attend_tiles;
    if (top->attend_dense_f16) t.attend_dense_f16 = top->attend_dense_f16;
    if (top->to_float) t.to_float = top->to_float;
    return t;
}

struct Tables {
    KernelTable scalar, avx2, avx512;
    Tables()
    {
        scalar = *scalar_kernels();
        avx2 = merged(avx2_kernels(), scalar);
        avx512 = merged(avx512_kernels(), avx2);
    }
};

const Tables& tables()
{
    static const Tables t;
    return t;
}

const KernelTable* table_for(const char* name)
{
    if (!name) return nullptr;
    if (!std::strcmp(name, "scalar")) return &tables().scalar;
    if (!std::strcmp(name, "avx2")) return avx2_kernels() && features().avx2 ? &tables().avx2 : nullptr;
    if (!std::strcmp(name, "avx512"))
        return avx512_kernels() && features().avx512 ? &tables().avx512 : nullptr;
    return nullptr;
}

bool known_name(const char* name)
{
    return name && (!std::strcmp(name, "scalar") || !std::strcmp(name, "avx2") || !std::strcmp(name, "avx512"));
}

std::atomic<const KernelTable*> g_active{nullptr};
// The last ISA error. Guarded by g_error_mu: kvarn_set_isa may be called from several threads,
// and kvarn_isa_error hands each reader its own copy (a pointer into g_error would dangle).
std::mutex g_error_mu;
std::string g_error;
std::atomic<bool> g_error_lost{false};  // the last message could not be stored (out of memory)
std::once_flag g_init;
constexpr const char* kErrorLost = "out of memory while describing an ISA error";

// g_error = a + b + c. Never throws: it runs inside extern "C" entry points and call_once,
// where an escaping bad_alloc would terminate the interpreter.
void set_error(const char* a, const char* b = "", const char* c = "") noexcept
{
    try {
        std::string text = std::string(a) + b + c;
        std::lock_guard<std::mutex> lk(g_error_mu);
        g_error.swap(text);
        g_error_lost = false;
    } catch (...) {
        g_error_lost = true;
    }
}

void initialise()
{
    const char* forced = std::getenv("KVARN_ISA");
    if (forced && *forced) {
        const KernelTable* t = table_for(forced);
        if (t) {
            g_active = t;
            return;
        }
        set_error("KVARN_ISA=", forced,
                  known_name(forced) ? " is not supported by this CPU/build" : " is not a known ISA (scalar, avx2, avx512)");
        g_active = nullptr;  // kvarn_active_isa reports the error; kernels refuse to run
        return;
    }
    for (const char* name : {"avx512", "avx2", "scalar"}) {
        if (const KernelTable* t = table_for(name)) {
            g_active = t;
            return;
        }
    }
}

}  // namespace

const KernelTable* active_kernels()
{
    std::call_once(g_init, initialise);
    return g_active.load();
}

namespace {
// fork() while another thread holds g_error_mu (kvarn_set_isa, kvarn_isa_error) or runs the first-use
// selection left the child's copy locked for good: its first kvarn_isa_error hung. So the forking
// thread finishes the selection and takes the lock first, and both processes release it after.
void before_fork()
{
    active_kernels();
    g_error_mu.lock();
}
void after_fork() { g_error_mu.unlock(); }
[[maybe_unused]] const bool g_fork_handlers = pthread_atfork(before_fork, after_fork, after_fork) == 0;  // ENOMEM only
}  // namespace

namespace {
std::atomic<bool> g_vnni{true};  // use VNNI instructions where cpuid has them (kvarn_set_vnni)
}  // namespace

bool avx_vnni_on() { return g_vnni.load(std::memory_order_relaxed) && features().avx_vnni; }
bool avx512_vnni_on() { return g_vnni.load(std::memory_order_relaxed) && features().avx512_vnni; }

namespace {
std::atomic<bool> g_vbmi{true};  // use VBMI's byte permutes where cpuid has them (kvarn_set_vbmi)
}  // namespace

bool avx512_vbmi_on() { return g_vbmi.load(std::memory_order_relaxed) && features().avx512_vbmi; }

namespace {
// Default: int16 (k4 scores and 2-bit values in exact int32 sums of int16-rounded
// weights: relative L2 ~1e-4 from the float path, thousands of times below the
// quantisation's own error) wherever the active kernels run it (score_mode()), else float.
// float (within 1e-5 of float64) and int8 (an int8 query: ~7e-3 on real queries, 4e-2 on
// random ones) by KVARN_SCORES or set_score_mode; see docs/simd.md.
std::atomic<int> g_score_mode{-1};  // -1: not read from the environment yet (another value than the three: int16)

int score_mode_flag()
{
    int v = g_score_mode.load(std::memory_order_relaxed);
    if (v < 0) {
        const char* env = std::getenv("KVARN_SCORES");
        v = kScoresInt16;
        if (env && *env) {
            if (!std::strcmp(env, "float")) v = kScoresFloat;
            else if (!std::strcmp(env, "int16")) v = kScoresInt16;
            else if (!std::strcmp(env, "int8")) v = kScoresInt8;
        }
        int expected = -1;
        if (!g_score_mode.compare_exchange_strong(expected, v)) v = expected;
    }
    return v;
}
}  // namespace

// The mode the active kernels run: avx512 and avx2 run float and int16 (vpdpwssd with
// VNNI, else vpmaddwd + vpaddd: the same sums); int8 runs on avx2 (vpdpbusd with AVX-VNNI,
// else vpmaddubsw + vpaddw) and on avx512 with VNNI (vpdpbusd); avx512 without VNNI runs
// int16 (the closest, more precise mode) instead; scalar runs float.
int score_mode()
{
    const KernelTable* t = active_kernels();
    const int want = score_mode_flag();
    if (want == kScoresFloat || t == nullptr || t == &tables().scalar) return kScoresFloat;
    if (want == kScoresInt8 && (t == &tables().avx2 || (t == &tables().avx512 && avx512_vnni_on()))) return kScoresInt8;
    return kScoresInt16;
}

}  // namespace kvarn

extern "C" {

const char* kvarn_active_isa(void)
{
    const kvarn::KernelTable* t = kvarn::active_kernels();
    return t ? t->name : "none";
}

int kvarn_isa_available(const char* name) { return kvarn::table_for(name) != nullptr; }

int kvarn_set_isa(const char* name)
{
    kvarn::active_kernels();  // run initialisation first so it cannot overwrite this choice
    const kvarn::KernelTable* t = kvarn::table_for(name);
    if (!t) {
        kvarn::set_error(name ? name : "(null)",
                         kvarn::known_name(name) ? " is not supported by this CPU/build" : " is not a known ISA");
        return KVARN_ERR_ISA;
    }
    kvarn::set_error("");
    kvarn::g_active = t;
    return KVARN_OK;
}

int kvarn_set_score_mode(int32_t mode)
{
    if (mode < kvarn::kScoresFloat || mode > kvarn::kScoresInt8) return KVARN_ERR_ARGUMENT;
    // the integer modes run wherever a SIMD table does (int8 on avx512 only with VNNI: int16 there without it)
    if (mode != kvarn::kScoresFloat && !kvarn::features().avx2) return KVARN_ERR_ISA;
    kvarn::score_mode_flag();  // read the environment first so it cannot overwrite this choice
    kvarn::g_score_mode = mode;
    return KVARN_OK;
}

int kvarn_score_mode(void) { return kvarn::score_mode(); }

int kvarn_cpu_has_vnni(void) { return kvarn::features().avx512_vnni ? 1 : 0; }

int kvarn_cpu_has_avx_vnni(void) { return kvarn::features().avx_vnni ? 1 : 0; }

void kvarn_set_vnni(int32_t on) { kvarn::g_vnni = on != 0; }

int kvarn_cpu_has_vbmi(void) { return kvarn::features().avx512_vbmi ? 1 : 0; }

void kvarn_set_vbmi(int32_t on) { kvarn::g_vbmi = on != 0; }

int kvarn_vbmi(void) { return kvarn::active_kernels() == &kvarn::tables().avx512 && kvarn::avx512_vbmi_on() ? 1 : 0; }

int kvarn_vnni(void)
{
    const kvarn::KernelTable* t = kvarn::active_kernels();
    if (t == &kvarn::tables().avx512) return kvarn::avx512_vnni_on() ? 1 : 0;
    if (t == &kvarn::tables().avx2) return kvarn::avx_vnni_on() ? 1 : 0;
    return 0;
}

const char* kvarn_isa_error(void)
{
    kvarn::active_kernels();
    thread_local std::string copy;  // this thread's snapshot: valid until its next call
    try {
        std::lock_guard<std::mutex> lk(kvarn::g_error_mu);
        if (kvarn::g_error_lost) return kvarn::kErrorLost;
        copy = kvarn::g_error;
    } catch (...) {  // the copy's allocation: no exception may leave a C entry point
        return kvarn::kErrorLost;
    }
    return copy.c_str();
}

}  // extern "C"
