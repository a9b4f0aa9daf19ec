/* fiber.cc — fiber stacks and the context switch.
 *
 * A CUDA thread runs on a fiber: its own stack, switched to and from cooperatively on one
 * OS thread (fibers never migrate). On x86-64 the switch is ours: save the callee-saved
 * registers, the MXCSR and x87 control words on the old stack, store the stack pointer,
 * load the new one, restore (tens of ns, no syscall). Elsewhere it falls back to glibc
 * swapcontext, which makes a sigprocmask syscall per switch.
 *
 * Stacks come from mmap (never touched until used) with a PROT_NONE guard page below, so
 * an overflow is a SIGSEGV, not silent corruption. Under ASan every switch tells the
 * sanitizer which stack is about to run (__sanitizer_start/finish_switch_fiber).
 */
#include "internal.h"

#include <sys/mman.h>
#include <unistd.h>

#if EMU_ASM_SWITCH
/* emu_ctx_switch(void **save_sp, void *new_sp): the frame it leaves on the old stack is
 * [mxcsr, x87 cw][r15 r14 r13 r12 rbx rbp][return address]. A new fiber's stack holds the
 * same frame with r12 = arg, r13 = entry and the return address = emu_ctx_start. */
extern "C" void emu_ctx_start(void);
asm(R"(
    .text
    .p2align 4
    .globl emu_ctx_switch
    .hidden emu_ctx_switch
    .type emu_ctx_switch,@function
emu_ctx_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size emu_ctx_switch,.-emu_ctx_switch

    .p2align 4
    .globl emu_ctx_start
    .hidden emu_ctx_start
    .type emu_ctx_start,@function
emu_ctx_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size emu_ctx_start,.-emu_ctx_start
)");
#endif

namespace emu {

void fiber_init_native(fiber *f)
{
    *f = fiber();
#if EMU_ASAN
    /* The sanitizer needs the bounds of the stack it switches back to. */
    pthread_attr_t at;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        void *lo;
        size_t sz;
        pthread_attr_getstack(&at, &lo, &sz);
        f->stack_lo = (char *)lo;
        f->stack_size = sz;
        pthread_attr_destroy(&at);
    }
#endif
#if !EMU_ASM_SWITCH
    f->impl = new ucontext_t();
#endif
}

#if !EMU_ASM_SWITCH
/* makecontext passes ints only: the entry and its argument travel through here. */
static __thread void (*tl_start_entry)(void *);
static __thread void *tl_start_arg;
static void ucontext_start(void)
{
    void (*entry)(void *) = tl_start_entry;
    void *arg = tl_start_arg;
    entry(arg);
    abort();
}
#endif

void fiber_create(fiber *f, size_t stack_bytes, unsigned index, void (*entry)(void *), void *arg)
{
    *f = fiber();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    stack_bytes = (stack_bytes + page - 1) / page * page;
    size_t total = stack_bytes + page;
    void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                   -1, 0);
    if (m == MAP_FAILED) fail("cannot map a %zu KiB fiber stack", stack_bytes / 1024);
    if (mprotect(m, page, PROT_NONE) != 0) fail("cannot protect a fiber stack guard page");
    f->map = m;
    f->map_size = total;
    f->stack_lo = (char *)m + page;
    f->stack_size = stack_bytes;
#if EMU_ASM_SWITCH
    /* Stacks are whole pages, so every fiber's top would sit at the same offset in its page:
     * the same L1 sets, and each switch's pops would alias the pushes just made on the other
     * stack (4 KiB aliasing: a false store-to-load dependency). Fibers start 320 bytes
     * apart modulo a page instead (5 cache lines; 64 offsets before they repeat). */
    uintptr_t top = ((uintptr_t)(f->stack_lo + stack_bytes - (index * 320u) % (unsigned)page)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    /* return address of the first switch: emu_ctx_start then runs with rsp = top, so the
     * entry function starts with the ABI's rsp % 16 == 8 */
    *--sp = (uint64_t)(uintptr_t)&emu_ctx_start;
    *--sp = 0;                        /* rbp */
    *--sp = 0;                        /* rbx */
    *--sp = (uint64_t)(uintptr_t)arg; /* r12 */
    *--sp = (uint64_t)(uintptr_t)entry; /* r13 */
    *--sp = 0;                        /* r14 */
    *--sp = 0;                        /* r15 */
    uint32_t csr;
    uint16_t cw;
    asm volatile("stmxcsr %0" : "=m"(csr));
    asm volatile("fnstcw %0" : "=m"(cw));
    --sp;
    memcpy((char *)sp, &csr, 4);
    memcpy((char *)sp + 4, &cw, 2);
    f->sp = sp;
#else
    ucontext_t *uc = new ucontext_t();
    getcontext(uc);
    uc->uc_stack.ss_sp = f->stack_lo;
    uc->uc_stack.ss_size = stack_bytes;
    uc->uc_link = nullptr;
    tl_start_entry = entry;
    tl_start_arg = arg;
    makecontext(uc, ucontext_start, 0);
    f->impl = uc;
#endif
}

void fiber_destroy(fiber *f)
{
    if (f->map) {
#if EMU_ASAN
        __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
        munmap(f->map, f->map_size);
    }
#if !EMU_ASM_SWITCH
    delete (ucontext_t *)f->impl;
#endif
    *f = fiber();
}

void fiber_started(fiber *f)
{
    (void)f;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

} // namespace emu
