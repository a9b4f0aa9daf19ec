/* emu_test.h — helpers shared by the emulator's own tests (tests/emu/test_emu_*.cu).
 *
 *   emu_child r = emu_run_child(fn);   runs fn in a fork()ed child with its stderr captured
 *                                      (killed after EMU_CHILD_TIMEOUT_S and run once more)
 *   emu_run_self("--case", "VAR=v")     runs this test binary again (fresh process, so the
 *                                      emulator reads VAR at start-up) with one argument
 *   emu_died_by_abort(r)               the child was killed by SIGABRT (an emulator abort)
 *   emu_err_has(r, "text")             its stderr contains text (printed on failure)
 *   EMU_CHECK_CUDA(call)               CHECK(call == cudaSuccess) with the error's name
 *   cudaLaunchHostFunc(s, wait_gate, &g)  holds stream s until g.open (at most 2 s)
 *
 * The child's stdout goes to /dev/null and it exits 0 if fn returns; a child that reports
 * through AddressSanitizer exits non-zero with the report on stderr.
 */
#ifndef TESSERA_EMU_TEST_H
#define TESSERA_EMU_TEST_H

#include "tests/c/test.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <atomic>
#include <string>
#include <thread>

struct emu_child {
    bool signaled;
    int sig;       /* when signaled */
    int exit_code; /* otherwise */
    std::string err;
};

/* A child that has not ended after this long is taken for hung (a child normally ends in
 * seconds, under the sanitizer too). */
#ifndef EMU_CHILD_TIMEOUT_S
#define EMU_CHILD_TIMEOUT_S 120
#endif

/* One fork()ed run of fn (emu_run_child); *hung: it was killed at EMU_CHILD_TIMEOUT_S. */
static inline emu_child emu_run_child_once(const std::function<void()> &fn, bool *hung)
{
    emu_child r = { false, 0, -1, std::string() };
    *hung = false;
    int fds[2];
    if (pipe(fds) != 0) return r;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1);
        fn();
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    close(fds[1]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(EMU_CHILD_TIMEOUT_S);
    char buf[4096];
    for (;;) {
        const long left = (long)std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now()).count();
        struct pollfd pfd = { fds[0], POLLIN, 0 };
        if (left <= 0 || poll(&pfd, 1, (int)left) == 0) { /* no end in sight: kill it */
            *hung = true;
            kill(pid, SIGKILL);
            break;
        }
        const ssize_t n = read(fds[0], buf, sizeof buf);
        if (n > 0) r.err.append(buf, (size_t)n);
        else if (n == 0 || errno != EINTR) break;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    r.signaled = WIFSIGNALED(status);
    r.sig = r.signaled ? WTERMSIG(status) : 0;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

/* fn in a fork()ed child, stderr captured. A fork()ed copy of a process with threads (the
 * emulator's stream workers, helpers and watchdog) can block forever on a lock another
 * thread held at the fork: the emulator's own locks are taken around fork()
 * (pthread_atfork), but not every lock outside it is (the sanitizer's allocator, presumably),
 * and one such child was seen to hang in make asan, blocked on a futex. A child still running after EMU_CHILD_TIMEOUT_S is
 * killed and fn run once more, in a new child; a second hang is returned as is (killed by
 * SIGKILL), which fails the caller's checks. */
static inline emu_child emu_run_child(const std::function<void()> &fn)
{
    bool hung;
    emu_child r = emu_run_child_once(fn, &hung);
    if (!hung) return r;
    fprintf(stderr, "emu_run_child: a child hung for %d s (a lock held across fork()?): killed, run once more\n",
            EMU_CHILD_TIMEOUT_S);
    return emu_run_child_once(fn, &hung);
}

/* Runs /proc/self/exe with argument arg and environment assignment env ("NAME=value") in a
 * child, stderr captured. */
static inline emu_child emu_run_self(const char *arg, const char *env)
{
    return emu_run_child([arg, env] {
        putenv((char *)env);
        execl("/proc/self/exe", "emu-test-child", arg, (char *)nullptr);
        _exit(127);
    });
}

static inline bool emu_died_by_abort(const emu_child &r) { return r.signaled && r.sig == SIGABRT; }

static inline bool emu_err_has(const emu_child &r, const char *text)
{
    if (r.err.find(text) != std::string::npos) return true;
    fprintf(stderr, "    child stderr lacks \"%s\"; it was:\n%s\n", text, r.err.c_str());
    return false;
}

#define EMU_CHECK_CUDA(call)                                                                  \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorName(e_));                      \
    } while (0)

static inline double emu_now_us(void)
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* A gate for wait_gate: a host function that holds its stream until `open` is set (then
 * or after 2 s, `timed_out`), counting its runs. */
struct gate {
    std::atomic<int> open{ 0 };
    std::atomic<int> timed_out{ 0 };
    std::atomic<int> runs{ 0 };
};

static inline void CUDART_CB wait_gate(void *p)
{
    gate *g = (gate *)p;
    g->runs++;
    const double t0 = emu_now_us();
    while (!g->open.load()) {
        if (emu_now_us() - t0 > 2e6) {
            g->timed_out = 1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

#endif
