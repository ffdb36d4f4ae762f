// After the process idles for a while, does a woken helper thread arrive late, or run slowly? The pool's pattern
// (a condition-variable wake, items taken from an atomic counter) with a fixed ~30 us item of dependent FMAs:
// per job, when the wake call returns to the caller, when the helper starts its first item, how many of 8 items each
// thread ran, and each thread's mean time per item, after idle gaps of 0.05 to 5 ms. g++ -O2 -pthread wake_probe.cpp -o wake_probe && ./wake_probe
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

static volatile double sink;
static void item_work()  // ~30 us of dependent FMAs at ~3 GHz
{
    double x = 1.0;
    for (int i = 0; i < 22000; ++i) x = x * 1.0000001 + 1e-9;
    sink = x;
}

int main()
{
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<int> gen{0}, next{0}, done{0};
    const int items = 8;
    clk::time_point helper_first;
    double item_us[2] = {0, 0};
    int count[2] = {0, 0};
    auto run_items = [&](int who) {
        for (int i; (i = next.fetch_add(1)) < items;) {
            const auto a = clk::now();
            if (who == 1 && count[1] == 0) helper_first = a;
            item_work();
            item_us[who] += us(a, clk::now());
            ++count[who];
            done.fetch_add(1);
        }
    };
    std::thread helper([&] {
        int seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return gen.load() != seen; });
            seen = gen.load();
            lk.unlock();
            if (seen < 0) return;
            run_items(1);
        }
    });
    for (double idle_ms : {0.05, 0.2, 1.0, 2.0, 5.0}) {
        std::vector<double> late, total, main_item, helper_item, helper_share, notify;
        for (int rep = 0; rep < 60; ++rep) {
            std::this_thread::sleep_for(std::chrono::microseconds((int)(idle_ms * 1000)));
            next = 0; done = 0; count[0] = count[1] = 0; item_us[0] = item_us[1] = 0;
            const auto t0 = clk::now();
            helper_first = t0;
            { std::lock_guard<std::mutex> lk(mu); gen.fetch_add(1); }
            cv.notify_all();
            notify.push_back(us(t0, clk::now()));
            run_items(0);
            while (done.load() < items) {}
            const auto t1 = clk::now();
            total.push_back(us(t0, t1));
            late.push_back(count[1] ? us(t0, helper_first) : us(t0, t1));
            helper_share.push_back(count[1]);
            main_item.push_back(item_us[0] / std::max(1, count[0]));
            if (count[1]) helper_item.push_back(item_us[1] / count[1]);
        }
        auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        std::printf("idle %.2f ms: job median %.0f us; the wake returned after %.0f us (median, max %.0f); helper's first item "
                    "after %.0f us; helper ran %.1f of %d items; per item: caller %.1f us, helper %.1f us (medians)\n",
                    idle_ms, med(total), med(notify), *std::max_element(notify.begin(), notify.end()), med(late),
                    med(helper_share), items, med(main_item), med(helper_item));
    }
    { std::lock_guard<std::mutex> lk(mu); gen = -1; }
    cv.notify_all();
    helper.join();
}
