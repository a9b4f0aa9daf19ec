/* pool.cc — the block worker pool.
 *
 * TESSERA_EMU_THREADS - 1 helper threads (started on first use, never stopped) plus the
 * thread that asks: parallel_for(n, fn) publishes a job, the caller and any idle helpers
 * claim indices from it with an atomic counter, and the caller returns once every claimed
 * call has returned. Several jobs (grids launched from different streams, GEMMs) may be
 * open at once; helpers take whichever has unclaimed work. No allocation per job.
 *
 * State: one mutex, two condition variables and the list of open jobs, heap-allocated
 * once and never freed (helpers may still wait on them while the process exits).
 */
#include "internal.h"

#include <pthread.h>

#include <new>
#include <thread>

namespace emu {

namespace {

struct job {
    size_t n;
    std::atomic<size_t> next{ 0 };
    const std::function<void(size_t)> *fn;
    int helpers = 0; /* helpers working on it (under the pool mutex) */
};

struct pool_state {
    std::mutex mu;
    std::condition_variable work, idle;
    std::vector<job *> jobs;
    int nhelpers = 0;
    bool started = false;
};

pool_state &pool();

/* fork(): the child has no helpers; it starts new ones on first use. */
void fork_prepare() { pool().mu.lock(); }
void fork_parent() { pool().mu.unlock(); }
void fork_child()
{
    pool_state &p = pool();
    new (&p.work) std::condition_variable();
    new (&p.idle) std::condition_variable();
    p.started = false;
    p.nhelpers = 0;
    p.mu.unlock();
}

pool_state &pool()
{
    static pool_state *p = [] {
        pool_state *n = new pool_state();
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        return n;
    }();
    return *p;
}

void run_items(job *j)
{
    for (;;) {
        size_t i = j->next.fetch_add(1, std::memory_order_relaxed);
        if (i >= j->n) return;
        (*j->fn)(i);
    }
}

job *find_work(pool_state &p)
{
    for (job *j : p.jobs)
        if (j->next.load(std::memory_order_relaxed) < j->n) return j;
    return nullptr;
}

void helper_main()
{
    pool_state &p = pool();
    std::unique_lock<std::mutex> lk(p.mu);
    for (;;) {
        job *j;
        p.work.wait(lk, [&] { return (j = find_work(p)) != nullptr; });
        j->helpers++;
        lk.unlock();
        run_items(j);
        lk.lock();
        if (--j->helpers == 0) p.idle.notify_all();
    }
}

void start_helpers()
{
    pool_state &p = pool();
    std::lock_guard<std::mutex> lk(p.mu);
    if (p.started) return;
    p.started = true;
    p.nhelpers = cfg().threads - 1;
    for (int i = 0; i < p.nhelpers; i++) std::thread(helper_main).detach();
}

} // namespace

void parallel_for(size_t n, const std::function<void(size_t)> &fn)
{
    if (n == 0) return;
    start_helpers();
    pool_state &p = pool();
    if (n == 1 || p.nhelpers == 0) {
        for (size_t i = 0; i < n; i++) fn(i);
        return;
    }
    job j;
    j.n = n;
    j.fn = &fn;
    {
        std::lock_guard<std::mutex> lk(p.mu);
        p.jobs.push_back(&j);
    }
    if (n - 1 >= (size_t)p.nhelpers) p.work.notify_all();
    else
        for (size_t i = 0; i + 1 < n; i++) p.work.notify_one();
    run_items(&j);
    std::unique_lock<std::mutex> lk(p.mu);
    p.jobs.erase(std::find(p.jobs.begin(), p.jobs.end(), &j));
    p.idle.wait(lk, [&] { return j.helpers == 0; });
}

} // namespace emu
