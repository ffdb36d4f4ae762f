// A profiler for machines without perf (the lent Xeon): LD_PRELOAD'ed, it samples the main thread's interrupted
// instruction pointer every $SAMPLER_US microseconds (default 100) of wall time (a CLOCK_MONOTONIC POSIX timer,
// high-resolution, signalling that thread: setitimer's CPU-time timers tick at the kernel's HZ only), and at exit
// writes the addresses to $SAMPLER_OUT and, unless the program has written it (loop.py does: on the lent Xeon's
// Python 3.12 the native module was no longer mapped when this library's destructor ran), this process's
// /proc/self/maps to $SAMPLER_OUT.maps. For a busy single-threaded process (kvarn at num_threads=1 runs on the
// calling thread).
// Build: gcc -O2 -shared -fPIC -o sampler.so sampler.c -lrt
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

enum { kMaxSamples = 1 << 22 };
static unsigned long samples[kMaxSamples];
static long count;
static timer_t timer;

static void on_prof(int sig, siginfo_t* info, void* context)
{
    (void)sig, (void)info;
    const long i = __atomic_fetch_add(&count, 1, __ATOMIC_RELAXED);
    if (i < kMaxSamples) samples[i] = (unsigned long)((ucontext_t*)context)->uc_mcontext.gregs[REG_RIP];
}

__attribute__((constructor)) static void start(void)
{
    if (!getenv("SAMPLER_OUT")) return;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    const long us = getenv("SAMPLER_US") ? atol(getenv("SAMPLER_US")) : 100;
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGPROF;
    ev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    timer_create(CLOCK_MONOTONIC, &ev, &timer);
    struct itimerspec t = {{0, us * 1000}, {0, us * 1000}};
    timer_settime(timer, 0, &t, NULL);
}

__attribute__((destructor)) static void stop(void)
{
    const char* out = getenv("SAMPLER_OUT");
    if (!out) return;
    timer_delete(timer);
    FILE* f = fopen(out, "w");
    const long n = count < kMaxSamples ? count : kMaxSamples;
    for (long i = 0; i < n; ++i) fprintf(f, "%lx\n", samples[i]);
    fclose(f);
    char maps[4096];
    snprintf(maps, sizeof maps, "%s.maps", out);
    FILE* exists = fopen(maps, "r");
    if (exists) {
        fclose(exists);
        return;
    }
    FILE* src = fopen("/proc/self/maps", "r");
    FILE* dst = fopen(maps, "w");
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, src)) > 0) fwrite(buf, 1, k, dst);
    fclose(src);
    fclose(dst);
}
