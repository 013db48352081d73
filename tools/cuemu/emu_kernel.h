/* tools/cuemu/emu_kernel.h — the prelude that turns hpc's CUDA C++ into host
 * C++ (tools/cuemu/cuemu.h says what the emulator is for).
 *
 * emu_module.c preprocesses every module behind this header (g++
 * -DHPC_EMU), rewrites its inline PTX into the emu_asm_* calls below,
 * adds an entry emu_entry_NAME (emu::entry) for each __global__ function
 * and compiles it into a shared object.
 *
 * What it promises:
 *   - Each CUDA thread runs as a fiber on the calling OS thread, the blocks
 *     of a grid one after another, the threads of a block round-robin,
 *     switching only at __syncthreads and the warp collectives.  A kernel
 *     with __cluster_dims__ runs a cluster's blocks together instead, their
 *     threads round-robin across the blocks, so that one block may wait on
 *     another's arrivals, multicast TMA loads and barrier.cluster.
 *   - Shared memory is a window of 227 KiB per block: dynamic bytes first,
 *     then each __shared__ variable (emu_asm.c rewrites its declaration)
 *     where its declaration first runs in the block; shared addresses
 *     (__cvta_generic_to_shared, wgmma descriptors) are window offsets;
 *     shared::cluster ones (mapa) the offset with rank + 1 in bits 24 up.
 *   - __syncthreads waits for every thread of the block that has not
 *     exited; a warp collective for the lanes of its mask that have not
 *     exited.  A barrier nobody can pass is reported as a deadlock with the
 *     kernel, the block and where the threads wait, not a hang.
 *   - mma.sync m16n8k16 (f16 and bf16, f32 accumulate), ldmatrix x4 (and
 *     .trans), stmatrix x4 and cp.async are computed from the fragment layouts of the PTX
 *     ISA manual; cp.async copies at once, so its waits are no-ops; so do
 *     the TMA's 2-D tensor loads, which complete their bytes on an
 *     mbarrier at once; a failed mbarrier wait lets the other threads run.
 *     A TMA store (shared to global) happens at the issuing thread's next
 *     cp.async.bulk.wait_group that does not leave its commit group pending
 *     (wait_group.read 1 leaves the newest), reading the shared bytes then;
 *     one still queued when its block ends is an error.
 *   - __trap() ends the process with the kernel's name, block and thread;
 *     a thread's stack found overflowed when its block ends, with the
 *     kernel, block and thread too.
 * It leaves __CUDA_ARCH__ undefined, so code written for a newer
 * architecture takes its portable branch (red8_f32's atomicAdd loop).
 */
#ifndef HPC_TOOLS_CUEMU_EMU_KERNEL_H
#define HPC_TOOLS_CUEMU_EMU_KERNEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu_tmap.h"

/* ---- the language ------------------------------------------------------- */

#define __global__ __attribute__((used))   /* emu_module.c finds the kernels by it */
#define __launch_bounds__(...)
/* emu_module.c reads a kernel's cluster shape from this mark, then blanks it */
#define __cluster_dims__(...) __emu_cluster_dims__(__VA_ARGS__)
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ __emu_shared__   /* emu_asm.c places each such variable in the block's window */
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __builtin_assume(x) ((void)0)
#define __grid_constant__

struct uint3 { unsigned x, y, z; };

struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

/* CUDA's min/max are overloaded for every arithmetic type. */
template <typename A, typename B>
static inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <typename A, typename B>
static inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type T;
    return (T)a > (T)b ? (T)a : (T)b;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __expf(x) expf(x)   /* glibc declares its own __expf and __logf */
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

/* One OS thread runs every fiber, so an atomic is a read-modify-write. */
template <typename T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <typename T> static inline T atomicMax(T *p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <typename T> static inline T atomicMin(T *p, T v) { T old = *p; if (v < old) *p = v; return old; }
template <typename T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <typename T> static inline T atomicOr(T *p, T v) { T old = *p; *p = old | v; return old; }
template <typename T> static inline T atomicAnd(T *p, T v) { T old = *p; *p = old & v; return old; }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }
static inline unsigned atomicInc(unsigned *p, unsigned lim) { unsigned old = *p; *p = old >= lim ? 0 : old + 1; return old; }

/* ---- fibers ------------------------------------------------------------- */

namespace emu {

enum { RUNNABLE, AT_BARRIER, AT_WARP, AT_GROUP, AT_CLUSTER, DONE };
enum { STACK_BYTES = 256 * 1024, MAX_THREADS = 1024, SLOT_BYTES = 64, MAX_CLUSTER = 8 };

struct Thread {
    void *sp;              /* saved stack pointer while switched out */
    uint3 tid;
    unsigned linear, lane, warp;
    int state;
    unsigned warp_gen;     /* the warp barrier generation it waits for */
    unsigned warp_mask;    /* the lanes that barrier waits for */
    unsigned char group_slot[32];   /* what it gives a warpgroup collective (wgmma) */
    unsigned cluster_arrival;       /* 1 + the cluster barrier generation it arrived in
                                       until its wait, else 0 (one word: Thread stays 80 bytes) */
};

struct Warp {
    unsigned live;                 /* lanes that have not exited */
    unsigned arrived;              /* lanes waiting at a warp barrier */
    unsigned gen;
    unsigned char slot[32][SLOT_BYTES];
};

struct Cluster;

struct Block {
    const char *kernel;
    uint3 bid, gdim, bdim;
    Thread th[MAX_THREADS];
    Warp warps[MAX_THREADS / 32];
    int n, live, at_barrier;
    int group_live[MAX_THREADS / 128], group_arrived[MAX_THREADS / 128];   /* warpgroups: 128 threads */
    int bar_and, bar_or, bar_count;        /* this barrier's reductions */
    int res_and, res_or, res_count;        /* the last released one's */
    void *sched_sp;
    /* Shared memory: one window of SHARED_BYTES; the launch's dynamic bytes
     * first, then each __shared__ variable where its declaration first ran
     * in this block (0xA5 bytes until written). */
    unsigned dynamic_bytes, shared_top;
    int n_sites;
    struct { int site; unsigned offset; } sites[256];
    struct Mbar { unsigned addr; int count, pending; long long tx; unsigned phases; } mbars[64];
    int n_mbars;
    unsigned rank;          /* in its cluster (%cluster_ctarank) */
    Cluster *cluster;
    unsigned char *window;  /* its shared memory, 1024-aligned as swizzled layouts want */
    /* TMA stores issued and not yet waited for (cp.async.bulk.wait_group by
     * the issuing thread performs them: the latest moment the hardware may
     * read the shared bytes, so a staging rewritten before the wait shows) */
    struct PendingStore { unsigned thread; EmuTensorMap t; int c0, c1; unsigned src; unsigned group; } stores[32];
    int n_stores;
    /* each thread's cp.async.bulk.commit_group count: a queued store's
     * group is the count its commit made (0 until committed) */
    unsigned bulk_groups[MAX_THREADS];
    /* setmaxnreg: each warp's registers a thread (0: the launch's, not yet
     * changed) and the block's pool of registers its decs gave back */
    int warp_regs[MAX_THREADS / 32];
    int reg_pool;
};

/* The blocks that run together (__cluster_dims__; one block without it):
 * their fibers interleave, so one can wait for another's arrivals. */
struct Cluster {
    Block *blocks[MAX_CLUSTER];   /* by rank */
    int n;
    int live;                     /* threads of all its blocks that have not exited */
    int arrived;                  /* at the cluster barrier's current generation */
    unsigned gen;
    long long spins;              /* failed waits (mbarrier, setmaxnreg.inc) since one last completed */
};

enum { SHARED_BYTES = 232448 };   /* sm_90's most a block may have */
/* The running fiber's block's window (its Block::window), switched with g_block. */
static thread_local unsigned char *g_window;

static thread_local Block *g_block;
static thread_local Thread *g_cur;
static thread_local void (*g_body)(void *);
static thread_local void *g_body_arg;

[[noreturn]] static void die(const char *what)
{
    Block *b = g_block;
    if (b && g_cur && b->cluster && b->cluster->n > 1)
        fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u) (cluster rank %u), thread (%u,%u,%u): %s\n", b->kernel,
                b->bid.x, b->bid.y, b->bid.z, b->rank, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z, what);
    else if (b && g_cur)
        fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n", b->kernel,
                b->bid.x, b->bid.y, b->bid.z, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z, what);
    else
        fprintf(stderr, "cuemu: %s\n", what);
    abort();
}

/* Context switch: callee-saved registers and the FP control words on the
 * old stack, then the new stack's. */
extern "C" void emu_ctx_switch(void **save_sp, void *new_sp);
#if defined(__x86_64__)
asm(".text\n"
    ".p2align 4\n"
    ".hidden emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
#else
#error "cuemu: fibers are written for x86-64 only"
#endif

static inline void yield(void) { emu_ctx_switch(&g_cur->sp, g_block->sched_sp); }

static void thread_exit(void);

/* Where a fresh fiber starts: the kernel body, then it never runs again. */
static void fiber_start(void)
{
    g_body(g_body_arg);
    thread_exit();
    die("an exited thread was resumed");
}

static void *fresh_stack(unsigned char *base)
{
    uintptr_t top = ((uintptr_t)(base + STACK_BYTES)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                                  /* keeps the entry's alignment */
    *--sp = (uint64_t)(uintptr_t)fiber_start;   /* ret lands here, rsp = 16k + 8 */
    for (int r = 0; r < 6; r++) *--sp = 0;      /* rbp rbx r12 r13 r14 r15 */
    *--sp = 0x1F80ull | (0x037Full << 32);      /* mxcsr, x87 control word */
    return sp;
}

/* One mapping for all the stacks (every module has its own pool, and a
 * guard page per stack made thousands of mappings a module: the kernel's
 * limit on them ended long runs); its pages go back after each grid
 * (stack_release), or every module's touched stacks stay resident.  Just
 * below each stack lies a pattern (stack_fence) that stack_check finds
 * intact, or the fiber overflowed. */
enum { STACK_FENCE = 4096 };
static const unsigned long long STACK_PATTERN = 0x5a17c0de5a17c0deull;

static unsigned char *stack_pool(int n)
{
    static thread_local unsigned char *pool;
    static thread_local int have;
    if (n <= have) return pool;
    if (pool) munmap(pool, (size_t)have * (STACK_BYTES + STACK_FENCE));
    size_t bytes = (size_t)n * (STACK_BYTES + STACK_FENCE);
    pool = (unsigned char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pool == MAP_FAILED) die("no memory for the fibers' stacks");
    have = n;
    return pool;
}

static inline unsigned long long *stack_fence(unsigned char *pool, int i)
{
    return (unsigned long long *)(pool + (size_t)i * (STACK_BYTES + STACK_FENCE) + STACK_FENCE) - 8;
}

static void stack_release(unsigned char *pool, int n)
{
    madvise(pool, (size_t)n * (STACK_BYTES + STACK_FENCE), MADV_DONTNEED);
}

/* After a block: the top of each fence (where an overflow writes first);
 * its threads' stacks are first .. first + b->n - 1 of the pool. */
static void stack_check(const Block *b, unsigned char *pool, int first)
{
    for (int i = 0; i < b->n; i++) {
        const unsigned long long *f = stack_fence(pool, first + i);
        for (int w = 0; w < 8; w++)
            if (f[w] != STACK_PATTERN) {
                fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u): thread %d overflowed its 256 KiB emulator stack\n",
                        b->kernel, b->bid.x, b->bid.y, b->bid.z, i);
                abort();
            }
    }
}

/* ---- barriers ----------------------------------------------------------- */

static void release_block_barrier(Block *b)
{
    b->res_and = b->bar_and;
    b->res_or = b->bar_or;
    b->res_count = b->bar_count;
    b->at_barrier = 0;
    b->bar_and = 1;
    b->bar_or = 0;
    b->bar_count = 0;
    for (int i = 0; i < b->n; i++)
        if (b->th[i].state == AT_BARRIER) b->th[i].state = RUNNABLE;
}

static void block_barrier(int pred)
{
    Block *b = g_block;
    b->bar_and &= pred != 0;
    b->bar_or |= pred != 0;
    b->bar_count += pred != 0;
    g_cur->state = AT_BARRIER;
    if (++b->at_barrier == b->live) release_block_barrier(b);
    yield();
}

/* Releases the lanes whose barrier has everyone it waits for. */
static void warp_try_release(Warp *w, Thread *lanes)
{
    for (;;) {
        int released = 0;
        for (int l = 0; l < 32; l++) {
            Thread *t = &lanes[l];
            if (!(w->arrived >> l & 1u) || t->state != AT_WARP) continue;
            unsigned need = t->warp_mask & w->live;
            if ((w->arrived & need) != need) continue;
            for (int k = 0; k < 32; k++)
                if (need >> k & 1u) lanes[k].state = RUNNABLE;
            w->arrived &= ~need;
            w->gen++;
            released = 1;
            break;
        }
        if (!released) return;
    }
}

static Thread *warp_lanes(Block *b, unsigned warp) { return &b->th[warp * 32]; }

static void warp_barrier(unsigned mask)
{
    Block *b = g_block;
    Thread *t = g_cur;
    Warp *w = &b->warps[t->warp];
    if (!(mask >> t->lane & 1u)) die("a warp collective's mask leaves out the calling lane");
    t->state = AT_WARP;
    t->warp_mask = mask;
    w->arrived |= 1u << t->lane;
    warp_try_release(w, warp_lanes(b, t->warp));
    yield();
}

/* Warpgroup barrier (wgmma's collective): every thread of the 128 that
 * has not exited. */
static void release_group(Block *b, int g)
{
    b->group_arrived[g] = 0;
    for (int i = g * 128; i < b->n && i < (g + 1) * 128; i++)
        if (b->th[i].state == AT_GROUP) b->th[i].state = RUNNABLE;
}

static void group_barrier(void)
{
    Block *b = g_block;
    int g = (int)g_cur->linear / 128;
    g_cur->state = AT_GROUP;
    if (++b->group_arrived[g] == b->group_live[g]) release_group(b, g);
    yield();
}

/* barrier.cluster (PTX ISA, "barrier.cluster"): every thread of the
 * cluster that has not exited arrives, then waits for the generation it
 * arrived in to end; exited threads count as arrived, as __syncthreads
 * counts them. */
static void release_cluster_barrier(Cluster *c)
{
    c->arrived = 0;
    c->gen++;
    for (int r = 0; r < c->n; r++) {
        Block *b = c->blocks[r];
        for (int i = 0; i < b->n; i++)
            if (b->th[i].state == AT_CLUSTER) b->th[i].state = RUNNABLE;
    }
}

static void cluster_arrive(void)
{
    Cluster *c = g_block->cluster;
    if (g_cur->cluster_arrival) die("barrier.cluster.arrive twice without barrier.cluster.wait between");
    g_cur->cluster_arrival = c->gen + 1;
    if (++c->arrived == c->live) release_cluster_barrier(c);
}

static void cluster_wait(void)
{
    unsigned arrived_in = g_cur->cluster_arrival - 1;
    if (!g_cur->cluster_arrival) die("barrier.cluster.wait without barrier.cluster.arrive before it");
    g_cur->cluster_arrival = 0;
    if (arrived_in != g_block->cluster->gen) return;   /* released already */
    g_cur->state = AT_CLUSTER;
    yield();
}

static void thread_exit(void)
{
    Block *b = g_block;
    Thread *t = g_cur;
    Warp *w = &b->warps[t->warp];
    Cluster *c = b->cluster;
    t->state = DONE;
    b->live--;
    c->live--;
    if (t->cluster_arrival == c->gen + 1) c->arrived--;   /* an arrival without its wait no longer counts */
    if (c->arrived && c->arrived == c->live) release_cluster_barrier(c);
    w->live &= ~(1u << t->lane);
    int g = (int)t->linear / 128;
    b->group_live[g]--;
    if (b->group_arrived[g] && b->group_arrived[g] == b->group_live[g]) release_group(b, g);
    if (b->at_barrier && b->at_barrier == b->live) release_block_barrier(b);
    warp_try_release(w, warp_lanes(b, t->warp));
    yield();
}

/* Each lane puts `bytes` in its slot; after the first barrier every lane
 * reads what it needs; the second keeps the slots until all have read. */
static inline void *warp_deposit(const void *v, size_t bytes)
{
    Warp *w = &g_block->warps[g_cur->warp];
    memcpy(w->slot[g_cur->lane], v, bytes);
    return w->slot;
}
static inline const unsigned char *lane_slot(int lane) { return g_block->warps[g_cur->warp].slot[lane]; }

/* ---- the grid ----------------------------------------------------------- */

struct Dims {
    unsigned grid[3], block[3], dynamic_smem;   /* as emu_module.c's */
};

static void describe_deadlock(const Cluster *c)
{
    for (int r = 0; r < c->n; r++) {
        const Block *b = c->blocks[r];
        if (!b->live) continue;
        fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u): deadlock; %d threads live, %d at "
                "__syncthreads\n", b->kernel, b->bid.x, b->bid.y, b->bid.z, b->live, b->at_barrier);
        if (c->n > 1) {
            int waiting = 0;
            for (int i = 0; i < b->n; i++) waiting += b->th[i].state == AT_CLUSTER;
            fprintf(stderr, "  rank %u of a cluster of %d: %d threads wait at barrier.cluster (the cluster's %d "
                    "live threads: %d arrived)\n", b->rank, c->n, waiting, c->live, c->arrived);
        }
        for (int i = 0; i < b->n; i++) {
            const Thread *t = &b->th[i];
            if (t->state == AT_WARP)
                fprintf(stderr, "  thread %u waits at a warp collective (mask %08x, warp live %08x)\n",
                        t->linear, t->warp_mask, b->warps[t->warp].live);
            else if (t->state == AT_GROUP)
                fprintf(stderr, "  thread %u waits at a warpgroup collective (wgmma)\n", t->linear);
        }
    }
    abort();
}

/* A block's threads ready to start, their stacks first .. first + b->n - 1
 * of the pool. */
static void start_block(Block *b, unsigned char *pool, int first)
{
    b->live = b->n;
    b->at_barrier = 0;
    b->bar_and = 1, b->bar_or = 0, b->bar_count = 0;
    b->n_stores = 0;
    memset(b->bulk_groups, 0, sizeof b->bulk_groups);
    for (int w = 0; w < (b->n + 31) / 32; w++) {
        int lanes = b->n - w * 32 < 32 ? b->n - w * 32 : 32;
        b->warps[w].live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        b->warps[w].arrived = 0;
        b->warps[w].gen = 0;
    }
    for (int g = 0; g * 128 < b->n; g++) {
        b->group_live[g] = b->n - g * 128 < 128 ? b->n - g * 128 : 128;
        b->group_arrived[g] = 0;
    }
    for (int i = 0; i < b->n; i++) {
        Thread *t = &b->th[i];
        t->linear = (unsigned)i;
        t->tid.x = (unsigned)i % b->bdim.x;
        t->tid.y = (unsigned)i / b->bdim.x % b->bdim.y;
        t->tid.z = (unsigned)i / (b->bdim.x * b->bdim.y);
        t->lane = (unsigned)i % 32;
        t->warp = (unsigned)i / 32;
        t->state = RUNNABLE;
        t->cluster_arrival = 0;
        t->sp = fresh_stack(pool + (size_t)(first + i) * (STACK_BYTES + STACK_FENCE) + STACK_FENCE);
        for (int w = 0; w < 8; w++) stack_fence(pool, first + i)[w] = STACK_PATTERN;
    }
}

/* HPC_EMU_ORDER: the order the threads of a cluster take turns in.  A
 * kernel whose result depends on it is wrong on a GPU, so a check run
 * several ways sees more.  `forward` (unset): each round every runnable
 * thread of rank 0, then of rank 1, ..., each block's from its first;
 * `reverse`: the ranks and the threads from the last; `ahead`: forward,
 * but each block runs up to AHEAD_TURNS turns of its threads before the
 * next block's (a block far ahead of the others, as one scheduled earlier
 * on a GPU is: copies or arrivals that reach a block before it has set up
 * its barriers show); `warps`: each block's warps one after the other, from
 * the first, each running until none of its threads can (at most
 * AHEAD_TURNS turns), and `warps_reverse` from the last.  The forward
 * orders keep a block's warps in step (each thread runs to its next
 * collective in turn), which hides a missing __syncthreads between one
 * warp's reads of shared memory and another's writes to it (a prefetch
 * into a buffer still being read); with one warp far ahead, the writes
 * land first and the check fails. */
enum { ORDER_FORWARD, ORDER_REVERSE, ORDER_AHEAD, ORDER_WARPS, ORDER_WARPS_REVERSE, AHEAD_TURNS = 1024 };

static int thread_order(void)
{
    static int order = -1;
    if (order < 0) {
        const char *v = getenv("HPC_EMU_ORDER");
        if (!v || !*v || strcmp(v, "forward") == 0) order = ORDER_FORWARD;
        else if (strcmp(v, "reverse") == 0) order = ORDER_REVERSE;
        else if (strcmp(v, "ahead") == 0) order = ORDER_AHEAD;
        else if (strcmp(v, "warps") == 0) order = ORDER_WARPS;
        else if (strcmp(v, "warps_reverse") == 0) order = ORDER_WARPS_REVERSE;
        else die("HPC_EMU_ORDER: want forward, reverse, ahead, warps or warps_reverse");
    }
    return order;
}

/* Runs thread i of block b to its next switch if it can run; whether it did. */
static int thread_turn(Block *b, int i)
{
    if (b->th[i].state != RUNNABLE) return 0;
    g_cur = &b->th[i];
    emu_ctx_switch(&b->sched_sp, g_cur->sp);
    return 1;
}

/* One round of block b's turns in thread_order's `order`: each runnable
 * thread once (`turns` times over), or under the warps orders each warp in
 * turn until none of its threads can run.  Returns whether any thread ran. */
static int block_round(Block *b, int order, int turns)
{
    int ran = 0;
    if (order == ORDER_WARPS || order == ORDER_WARPS_REVERSE) {
        const int warps = (b->n + 31) / 32;
        for (int ww = 0; ww < warps; ww++) {
            const int w = order == ORDER_WARPS_REVERSE ? warps - 1 - ww : ww;
            for (int turn = 0, any = 1; any && turn < AHEAD_TURNS; turn++) {
                any = 0;
                for (int i = w * 32; i < w * 32 + 32 && i < b->n; i++) any |= thread_turn(b, i);
                ran |= any;
            }
        }
        return ran;
    }
    const bool reverse = order == ORDER_REVERSE;
    for (int turn = 0; turn < turns; turn++)
        for (int ii = 0; ii < b->n; ii++) ran |= thread_turn(b, reverse ? b->n - 1 - ii : ii);
    return ran;
}

/* Runs the cluster's blocks to their end in thread_order's turns; g_block
 * and g_window are the running thread's block's, so shared addresses and
 * __shared__ variables are its own.  (A cluster of one is the block alone,
 * as before clusters.) */
static void run_cluster(Cluster *c)
{
    const int order = thread_order();
    const bool reverse = order == ORDER_REVERSE || order == ORDER_WARPS_REVERSE;
    const int turns = order == ORDER_AHEAD ? AHEAD_TURNS : 1;
    unsigned char *pool = stack_pool(c->n * c->blocks[0]->n);
    c->live = 0;
    c->arrived = 0;
    c->gen = 0;
    c->spins = 0;
    for (int r = 0; r < c->n; r++) {
        start_block(c->blocks[r], pool, r * c->blocks[r]->n);
        c->live += c->blocks[r]->n;
    }
    while (c->live > 0) {
        int ran = 0;
        for (int rr = 0; rr < c->n; rr++) {
            Block *b = c->blocks[reverse ? c->n - 1 - rr : rr];
            g_block = b;
            g_window = b->window;
            ran |= block_round(b, order, turns);
        }
        if (!ran) describe_deadlock(c);
    }
    g_cur = NULL;
    for (int r = 0; r < c->n; r++) {
        g_block = c->blocks[r];
        if (g_block->n_stores)
            die("a TMA store (cp.async.bulk.tensor to global) not waited for (cp.async.bulk.wait_group) before its "
                "block ended");
        stack_check(c->blocks[r], pool, r * c->blocks[r]->n);
    }
}

/* Every block of the grid, cluster by cluster (cdim: the kernel's
 * __cluster_dims__; emu_module.c checked that they divide the grid).  The
 * cluster holding block (x, y, z) is the blocks with the same x / cx,
 * y / cy, z / cz; a block's rank is x % cx + (y % cy) cx + (z % cz) cx cy. */
static void run_grid(const char *name, const Dims *d, const unsigned cdim[3], void (*body)(void *), void *arg)
{
    unsigned n = d->block[0] * d->block[1] * d->block[2], csize = cdim[0] * cdim[1] * cdim[2];
    if (n == 0 || n > MAX_THREADS) {
        fprintf(stderr, "cuemu: kernel %s launched with %u threads a block\n", name, n);
        abort();
    }
    if (csize == 0 || csize > MAX_CLUSTER || d->grid[0] % cdim[0] || d->grid[1] % cdim[1] || d->grid[2] % cdim[2]) {
        fprintf(stderr, "cuemu: kernel %s: clusters of (%u,%u,%u) blocks do not tile its grid (%u,%u,%u)\n", name,
                cdim[0], cdim[1], cdim[2], d->grid[0], d->grid[1], d->grid[2]);
        abort();
    }
    if (d->dynamic_smem > SHARED_BYTES) {
        fprintf(stderr, "cuemu: kernel %s: more dynamic shared memory than a block may have\n", name);
        abort();
    }
    static thread_local Block *blocks[MAX_CLUSTER];
    static thread_local Cluster cluster;
    Block *saved = g_block;
    unsigned char *saved_window = g_window;
    g_body = body;
    g_body_arg = arg;
    cluster.n = (int)csize;
    for (unsigned r = 0; r < csize; r++) {
        if (!blocks[r]) {
            blocks[r] = (Block *)calloc(1, sizeof(Block));
            if (blocks[r]) blocks[r]->window = (unsigned char *)aligned_alloc(1024, SHARED_BYTES);
            if (!blocks[r] || !blocks[r]->window) die("no memory for a block and its shared-memory window");
        }
        Block *b = cluster.blocks[r] = blocks[r];
        b->kernel = name;
        b->n = (int)n;
        b->gdim = uint3{d->grid[0], d->grid[1], d->grid[2]};
        b->bdim = uint3{d->block[0], d->block[1], d->block[2]};
        b->dynamic_bytes = d->dynamic_smem;
        b->rank = r;
        b->cluster = &cluster;
    }
    for (unsigned cz = 0; cz < d->grid[2]; cz += cdim[2])
        for (unsigned cy = 0; cy < d->grid[1]; cy += cdim[1])
            for (unsigned cx = 0; cx < d->grid[0]; cx += cdim[0]) {
                for (unsigned r = 0; r < csize; r++) {
                    Block *b = blocks[r];
                    b->bid = uint3{cx + r % cdim[0], cy + r / cdim[0] % cdim[1], cz + r / (cdim[0] * cdim[1])};
                    memset(b->window, 0xA5, d->dynamic_smem);
                    b->shared_top = (d->dynamic_smem + 127) / 128 * 128;
                    b->n_sites = 0;
                    b->n_mbars = 0;
                    memset(b->warp_regs, 0, sizeof b->warp_regs);
                    b->reg_pool = 0;
                }
                run_cluster(&cluster);
            }
    stack_release(stack_pool((int)(n * csize)), (int)(n * csize));
    g_block = saved;
    g_window = saved_window;
}

/* ---- a kernel's entry: its parameters packed, then every block run ----- */

/* Where each parameter sits in the packed blob (each at its alignment, in
 * order); returns the blob's size. */
template <typename... A> static size_t param_offsets(size_t *offs)
{
    const size_t sizes[] = {sizeof(A)..., 0}, aligns[] = {alignof(A)..., 1};
    size_t off = 0;
    for (size_t i = 0; i < sizeof...(A); i++) {
        off = (off + aligns[i] - 1) / aligns[i] * aligns[i];
        offs[i] = off;
        off += sizes[i];
    }
    return off;
}

/* cuLaunchKernel's parameters (an array of pointers to each value) into blob. */
template <typename... A> static size_t pack_params(void **params, unsigned char *blob)
{
    size_t offs[sizeof...(A) + 1];
    const size_t sizes[] = {sizeof(A)..., 0};
    size_t total = param_offsets<A...>(offs);
    if (blob)
        for (size_t i = 0; i < sizeof...(A); i++) memcpy(blob + offs[i], params[i], sizes[i]);
    return total;
}

template <typename... A> struct Call {
    void (*fn)(A...);
    const unsigned char *blob;
};

template <typename... A, size_t... I>
static void call_unpacked(const Call<A...> *c, std::index_sequence<I...>)
{
    size_t offs[sizeof...(A) + 1];
    param_offsets<A...>(offs);
    c->fn(*(const typename std::remove_reference<A>::type *)(c->blob + offs[I])...);
}

template <typename... A> static void fiber_body(void *arg)
{
    call_unpacked((const Call<A...> *)arg, std::index_sequence_for<A...>{});
}

/* op 0: the packed size of the parameters into *size (and the bytes into
 * blob when it is not NULL); op 1: run the grid from a packed blob; op 2:
 * the kernel's cluster dims (unsigned[3]) into blob. */
template <typename... A>
static void entry(void (*fn)(A...), const char *name, int op, void **params, void *blob,
                  size_t *size, const Dims *d, unsigned cx, unsigned cy, unsigned cz)
{
    const unsigned cdim[3] = {cx, cy, cz};   /* __cluster_dims__, or 1, 1, 1 */
    if (op == 0) {
        *size = pack_params<A...>(params, (unsigned char *)blob);
        return;
    }
    if (op == 2) {
        memcpy(blob, cdim, sizeof cdim);
        return;
    }
    Call<A...> c = {fn, (const unsigned char *)blob};
    run_grid(name, d, cdim, fiber_body<A...>, &c);
}

/* ---- half precision ----------------------------------------------------- */

static inline float half_to_float(unsigned short h)
{
    unsigned sign = (unsigned)(h >> 15) << 31, exp = (h >> 10) & 31u, man = h & 1023u, bits;
    if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else {
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 1024u));
        bits = sign | ((unsigned)(112 - e) << 23) | ((man & 1023u) << 13);
    }
    return __uint_as_float(bits);
}
static inline float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

/* ---- warp collectives ----------------------------------------------------- */

template <typename T> static inline T shfl_from(T v, unsigned mask, int (*src_of)(int lane, int arg, int width), int arg, int width)
{
    static_assert(sizeof(T) <= SLOT_BYTES, "shuffled value too large");
    warp_deposit(&v, sizeof v);
    warp_barrier(mask);
    int src = src_of((int)g_cur->lane, arg, width);
    T out;
    memcpy(&out, lane_slot(src), sizeof out);
    warp_barrier(mask);
    return out;
}

static inline int lane_idx(int lane, int src, int width) { return (lane & ~(width - 1)) + (src & (width - 1)); }
static inline int lane_xor(int lane, int m, int width) { int s = lane ^ m; return s >= ((lane & ~(width - 1)) + width) ? lane : s; }
static inline int lane_up(int lane, int d, int width) { return (lane & (width - 1)) >= d ? lane - d : lane; }
static inline int lane_down(int lane, int d, int width) { return (lane & (width - 1)) + d < width ? lane + d : lane; }

static inline unsigned vote(unsigned mask, int pred, int how)
{
    int p = pred != 0;
    warp_deposit(&p, sizeof p);
    warp_barrier(mask);
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) {
        int q;
        if (!(mask >> l & 1u) || !(g_block->warps[g_cur->warp].live >> l & 1u)) continue;
        memcpy(&q, lane_slot(l), sizeof q);
        if (q) bits |= 1u << l;
    }
    warp_barrier(mask);
    if (how == 0) return bits;
    unsigned live = mask & g_block->warps[g_cur->warp].live;
    return how == 1 ? bits != 0 : (bits & live) == live;
}

/* mma.sync.m16n8k16.row.col, f32 accumulate (PTX ISA, "Matrix Fragments
 * for mma.m16n8k16"): lane = 4 group + t; A's registers hold rows group
 * and group + 8, columns 2t, 2t + 1 (+ 8 in registers 2 and 3); B's hold
 * k = 2t, 2t + 1 (+ 8 in register 1) of column group; C/D rows group and
 * group + 8, columns 2t, 2t + 1. */
struct MmaIn { unsigned a[4], b[2]; };

static inline float frag_elem(unsigned reg, int high, int bf16)
{
    unsigned short h = (unsigned short)(high ? reg >> 16 : reg & 0xffffu);
    return bf16 ? bf16_to_float(h) : half_to_float(h);
}

static inline void mma_16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1, int bf16)
{
    MmaIn in = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    warp_deposit(&in, sizeof in);
    warp_barrier(0xffffffffu);
    int g = (int)g_cur->lane / 4, t = (int)g_cur->lane % 4;
    for (int r = 0; r < 4; r++) {
        int row = g + (r >= 2 ? 8 : 0), col = 2 * t + (r & 1);
        float acc = c[r];
        for (int k = 0; k < 16; k++) {
            MmaIn fa, fb;
            memcpy(&fa, lane_slot(row % 8 * 4 + k % 8 / 2), sizeof fa);
            memcpy(&fb, lane_slot(col * 4 + k % 8 / 2), sizeof fb);
            int areg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            acc += frag_elem(fa.a[areg], k & 1, bf16) * frag_elem(fb.b[k >= 8], k & 1, bf16);
        }
        c[r] = acc;
    }
    warp_barrier(0xffffffffu);
}

/* ldmatrix.m8n8.x4.b16: lanes 8i .. 8i + 7 give the rows of matrix i;
 * register i of a lane holds row lane/4, columns 2 (lane % 4) and +1 of
 * matrix i, or with .trans the same of its transpose. */
/* stmatrix.m8n8.x4.b16 (not transposed): ldmatrix_x4's inverse, lanes
 * 8i .. 8i + 7 giving the rows of matrix i, each lane's r[i] its pair of
 * row lane / 4, columns 2 (lane % 4) and the next. */
static inline void stmatrix_x4(unsigned short *p, const unsigned r[4])
{
    warp_deposit(&p, sizeof p);
    warp_barrier(0xffffffffu);
    int lane = (int)g_cur->lane;
    for (int i = 0; i < 4; i++) {
        unsigned short *row;
        memcpy(&row, lane_slot(8 * i + lane / 4), sizeof row);
        row[2 * (lane % 4)] = (unsigned short)(r[i] & 0xffffu);
        row[2 * (lane % 4) + 1] = (unsigned short)(r[i] >> 16);
    }
    warp_barrier(0xffffffffu);
}

static inline void ldmatrix_x4(unsigned r[4], const unsigned short *p, int trans)
{
    warp_deposit(&p, sizeof p);
    warp_barrier(0xffffffffu);
    int lane = (int)g_cur->lane;
    for (int i = 0; i < 4; i++) {
        const unsigned short *row0, *row1;
        unsigned short lo, hi;
        if (!trans) {
            memcpy(&row0, lane_slot(8 * i + lane / 4), sizeof row0);
            lo = row0[2 * (lane % 4)];
            hi = row0[2 * (lane % 4) + 1];
        } else {
            memcpy(&row0, lane_slot(8 * i + 2 * (lane % 4)), sizeof row0);
            memcpy(&row1, lane_slot(8 * i + 2 * (lane % 4) + 1), sizeof row1);
            lo = row0[lane / 4];
            hi = row1[lane / 4];
        }
        r[i] = (unsigned)lo | (unsigned)hi << 16;
    }
    warp_barrier(0xffffffffu);
}

}   /* namespace emu */

/* ---- what the kernels call -------------------------------------------- */

#define threadIdx (emu::g_cur->tid)
#define blockIdx (emu::g_block->bid)
#define blockDim (emu::g_block->bdim)
#define gridDim (emu::g_block->gdim)
#define warpSize 32

static inline void __syncthreads(void) { emu::block_barrier(1); }
static inline int __syncthreads_and(int p) { emu::block_barrier(p); return emu::g_block->res_and; }
static inline int __syncthreads_or(int p) { emu::block_barrier(p); return emu::g_block->res_or; }
static inline int __syncthreads_count(int p) { emu::block_barrier(p); return emu::g_block->res_count; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_barrier(mask); }
static inline unsigned __activemask(void) { return emu::g_block->warps[emu::g_cur->warp].live; }
static inline unsigned __ballot_sync(unsigned mask, int p) { return emu::vote(mask, p, 0); }
static inline int __any_sync(unsigned mask, int p) { return (int)emu::vote(mask, p, 1); }
static inline int __all_sync(unsigned mask, int p) { return (int)emu::vote(mask, p, 2); }
template <typename T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) { return emu::shfl_from(v, m, emu::lane_idx, src, w); }
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32) { return emu::shfl_from(v, m, emu::lane_xor, x, w); }
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return emu::shfl_from(v, m, emu::lane_up, (int)d, w); }
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return emu::shfl_from(v, m, emu::lane_down, (int)d, w); }
[[noreturn]] static inline void __trap(void) { emu::die("__trap()"); }

/* ---- inline PTX (emu_asm.c rewrites each statement into one of these) -- */

namespace emu {

/* Shared addresses are offsets in the block's window. */
static inline unsigned to_shared(const void *p)
{
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)g_window;
    if (a < base || a >= base + SHARED_BYTES) die("__cvta_generic_to_shared of a pointer outside shared memory");
    return (unsigned)(a - base);
}
static inline void *from_shared(unsigned a)
{
    if (a >= SHARED_BYTES) die("a shared address past the block's shared memory");
    return g_window + a;
}

/* The address of __shared__ variable `site` in this block: placed where
 * its declaration first runs, so every thread sees the same bytes. */
static inline void *shared_var(int site, size_t bytes, size_t align)
{
    Block *b = g_block;
    for (int i = 0; i < b->n_sites; i++)
        if (b->sites[i].site == site) return g_window + b->sites[i].offset;
    if (align < 16) align = 16;
    size_t at = (b->shared_top + align - 1) / align * align;
    if (at + bytes > SHARED_BYTES) die("the block's __shared__ variables pass 227 KiB");
    if (b->n_sites == 256) die("more than 256 __shared__ variables in one kernel");
    b->sites[b->n_sites].site = site;
    b->sites[b->n_sites++].offset = (unsigned)at;
    b->shared_top = (unsigned)(at + bytes);
    memset(g_window + at, 0xA5, bytes);
    return g_window + at;
}

static inline float ftz(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }

static inline unsigned short float_to_half_rn(float f)
{
    unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (exp == 0xff) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (unsigned short)(sign | 0x7c00u);
    unsigned full = man | 0x800000u;   /* 24 significant bits */
    int shift = e >= 1 ? 13 : 14 - e;  /* subnormal halves lose more */
    if (shift > 24) return (unsigned short)sign;
    unsigned kept = full >> shift, rest = full & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    unsigned bits = e >= 1 ? ((unsigned)e << 10) + (kept - 0x400u) : kept;
    return (unsigned short)(sign | bits);   /* a carry rounds into the exponent, or to inf */
}

static inline unsigned short float_to_bf16_rn(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* ---- wgmma.mma_async (PTX ISA, "Asynchronous Warpgroup Level Matrix
 * Multiply-Accumulate"), run synchronously ---------------------------- */

/* The shared-memory element (mn, k) of an operand through its matrix
 * descriptor: start address, leading byte offset (LBO: between core
 * matrices adjacent along K), stride byte offset (SBO: along M or N), each
 * >> 4, and the swizzle mode in bits 62-63.  Without swizzle a core matrix
 * is 8 rows of 16 bytes: K-major rows are mn (8 k each), MN-major rows are
 * k (8 mn each).  The swizzled modes (K-major only here) have rows of
 * 128, 64 or 32 bytes along K, 8 of them an atom (SBO apart), and XOR the
 * 16-byte chunk index with the row (address bits 7 and up).  On the GPU,
 * tests/gpu/gpu_wgmma.c checks the unswizzled reading; it runs here too. */
static inline const unsigned short *wgmma_elem(unsigned long long desc, int mn, int k, int mn_major)
{
    unsigned start = (unsigned)(desc & 0x3FFFu) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFFu) << 4,
             sbo = (unsigned)((desc >> 32) & 0x3FFFu) << 4, mode = (unsigned)(desc >> 62),
             base = (unsigned)((desc >> 49) & 7u);
    if (base) die("wgmma: a descriptor's base offset is not emulated");
    unsigned off;
    if (mode == 0) {
        if (mn_major)
            off = (unsigned)(k / 8) * lbo + (unsigned)(mn / 8) * sbo + (unsigned)(k % 8) * 16 + (unsigned)(mn % 8) * 2;
        else
            off = (unsigned)(mn / 8) * sbo + (unsigned)(k / 8) * lbo + (unsigned)(mn % 8) * 16 + (unsigned)(k % 8) * 2;
        return (const unsigned short *)from_shared(start + off);
    }
    unsigned width = mode == 1 ? 128 : mode == 2 ? 64 : 32, mask = width / 16 - 1;
    if (mn_major)   /* rows of `width` bytes along MN, 8 k rows an atom; LBO: the next atom along MN, SBO: along K
                       (CUTLASS's canonical MN-major layouts; not yet confirmed by the hardware: gpu_wgmma) */
        off = (unsigned)(mn * 2) / width * lbo + (unsigned)(k / 8) * sbo + (unsigned)(k % 8) * width +
              (unsigned)(mn * 2) % width;
    else
        off = (unsigned)(mn / 8) * sbo + (unsigned)(mn % 8) * width + (unsigned)(k * 2) % width +
              (unsigned)(k * 2) / width * lbo;
    unsigned addr = start + off;
    addr ^= ((addr >> 7) & mask) << 4;
    return (const unsigned short *)from_shared(addr);
}

struct WgmmaIn { unsigned a[4]; };

/* D (64 x n, f32; this thread's n/2 values through d) = scale_d D +
 * A (64 x 16) B (16 x n).  Accumulator layout: warp w of the group holds
 * rows 16w + lane/4 (and + 8), columns 8j + 2 (lane % 4) (and + 1) in
 * d[4j .. 4j + 3].  A from registers: each warp's 16 rows in mma.sync's
 * m16n8k16 A layout. */
static inline void wgmma_run(float *const *d, int n, int bf16, int a_regs, unsigned long long desc_a,
                             const unsigned a[4], unsigned long long desc_b, int scale_d, int scale_a,
                             int scale_b, int trans_a, int trans_b)
{
    WgmmaIn in = {{a[0], a[1], a[2], a[3]}};
    memcpy(g_cur->group_slot, &in, sizeof in);
    group_barrier();
    Block *b = g_block;
    int first = (int)g_cur->linear / 128 * 128, w = ((int)g_cur->linear - first) / 32, lane = (int)g_cur->lane;
    for (int j = 0; j < n / 8; j++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                int row = 16 * w + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4) + e;
                float acc = 0.0f;
                for (int k = 0; k < 16; k++) {
                    unsigned short ah;
                    if (a_regs) {
                        const Thread *t = &b->th[first + row / 16 * 32 + row % 8 * 4 + k % 8 / 2];
                        WgmmaIn o;
                        memcpy(&o, t->group_slot, sizeof o);
                        unsigned reg = o.a[(row % 16 >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
                        ah = (unsigned short)(k & 1 ? reg >> 16 : reg & 0xffffu);
                    } else {
                        ah = *wgmma_elem(desc_a, row, k, trans_a);
                    }
                    unsigned short bh = *wgmma_elem(desc_b, col, k, trans_b);
                    float av = bf16 ? bf16_to_float(ah) : half_to_float(ah);
                    float bv = bf16 ? bf16_to_float(bh) : half_to_float(bh);
                    acc += ((float)scale_a * av) * ((float)scale_b * bv);
                }
                float *out = d[4 * j + 2 * h + e];
                *out = (scale_d ? *out : 0.0f) + acc;
            }
    group_barrier();
}

/* ---- mbarrier and TMA (PTX ISA, "Parallel Synchronization and
 * Communication Instructions: mbarrier", "cp.async.bulk.tensor") ------- */

/* shared::cluster addresses (mapa's): the offset in the window of the
 * block of rank r, with r + 1 in bits 24 and up (the window's offsets need
 * 18 bits); a shared::cta address (no rank bits) is the own block's, as
 * the PTX ISA has it. */
enum { CLUSTER_RANK_SHIFT = 24 };

static inline unsigned mapa(unsigned addr, unsigned rank)
{
    unsigned offset = addr & ((1u << CLUSTER_RANK_SHIFT) - 1);
    if (offset >= SHARED_BYTES) die("mapa of an address past the block's shared memory");
    if (rank >= (unsigned)g_block->cluster->n) die("mapa to a rank outside the cluster");
    return offset | (rank + 1) << CLUSTER_RANK_SHIFT;
}

/* The block a shared::cluster address points into, and the offset there. */
static inline Block *cluster_block(unsigned addr, unsigned *offset)
{
    unsigned tag = addr >> CLUSTER_RANK_SHIFT;
    *offset = addr & ((1u << CLUSTER_RANK_SHIFT) - 1);
    if (!tag) return g_block;
    if (tag > (unsigned)g_block->cluster->n) die("a shared::cluster address of a rank outside the cluster");
    return g_block->cluster->blocks[tag - 1];
}

/* Before another block's shared memory is touched: on the GPU a block that
 * has exited has given its shared memory back (undefined behaviour). */
static inline void require_running(const Block *b, const char *what)
{
    if (b->live) return;
    char msg[200];
    snprintf(msg, sizeof msg, "%s into block (%u,%u,%u) (cluster rank %u), whose threads have all exited", what,
             b->bid.x, b->bid.y, b->bid.z, b->rank);
    die(msg);
}

/* A barrier object's state, by its shared address in block b: the
 * arrivals a phase needs, those still missing, the transaction bytes still
 * expected (below zero while bytes came before the expect_tx of their
 * phase, as a peer's multicast may), and the phases completed so far. */
static inline Block::Mbar *mbar_at(Block *b, unsigned addr, int create)
{
    for (int i = 0; i < b->n_mbars; i++)
        if (b->mbars[i].addr == addr) return &b->mbars[i];
    if (addr >= SHARED_BYTES)
        die("an mbarrier address past the window (a shared::cluster address where a shared::cta one belongs?)");
    if (!create) {
        char msg[160];
        snprintf(msg, sizeof msg, "an mbarrier (at %u of cluster rank %u's shared memory) used before mbarrier.init",
                 addr, b->rank);
        die(msg);
    }
    if (b->n_mbars == 64) die("more than 64 mbarriers in one block");
    Block::Mbar *m = &b->mbars[b->n_mbars++];
    m->addr = addr;
    return m;
}

/* The phase completes when no arrival is missing and no byte expected. */
static inline void mbar_check(Block::Mbar *m)
{
    if (m->pending == 0 && m->tx == 0) {
        m->phases++;
        m->pending = m->count;
        g_block->cluster->spins = 0;
    }
    if (m->pending < 0) die("an mbarrier got more arrivals than its count");
}

static inline void mbar_init(unsigned addr, int count)
{
    Block::Mbar *m = mbar_at(g_block, addr, 1);
    m->count = m->pending = count;
    m->tx = 0;
    m->phases = 0;
}

static inline void mbar_arrive(Block *b, unsigned addr, long long tx)
{
    Block::Mbar *m = mbar_at(b, addr, 0);
    m->tx += tx;
    m->pending--;
    mbar_check(m);
}

/* mbarrier.arrive.release.cluster.shared::cluster: one arrival on the
 * barrier of whichever block of the cluster addr points into. */
static inline void mbar_arrive_cluster(unsigned addr)
{
    unsigned offset;
    Block *b = cluster_block(addr, &offset);
    require_running(b, "mbarrier.arrive");
    mbar_arrive(b, offset, 0);
}

/* A failed wait: the thread lets the others (the cluster's included) run
 * first; after 10^8 failed waits with no progress in between, the run
 * stops with `deadlock`. */
static inline void wait_turn(const char *deadlock)
{
    if (++g_block->cluster->spins > 100000000LL) die(deadlock);
    yield();
}

/* Whether the phase of parity `parity` has completed (the current phase's
 * parity differs); if not, wait_turn. */
static inline unsigned mbar_try_wait(unsigned addr, unsigned parity)
{
    Block::Mbar *m = mbar_at(g_block, addr, 0);
    if ((m->phases & 1u) != (parity & 1u)) return 1;
    wait_turn("mbarrier waits that never complete (a deadlock)");
    return 0;
}

/* The registers a thread of a block of n threads starts with, as ptxas
 * gives a kernel that uses setmaxnreg: its __launch_bounds__ maximum, the
 * 65536 registers of an SM shared by the block's warps, rounded down to 8
 * (168 at 384 threads, 96 at 640; the "Used N registers" ptxas -v prints
 * for hpc's kernels). */
static inline int launch_regs(int n)
{
    int r = 65536 / (((n + 31) / 32) * 32) / 8 * 8;
    return r > 248 ? 248 : r;
}

/* setmaxnreg.inc / .dec to `count` registers a thread, accounted once a
 * warp (its lane 0): a dec gives the difference back to the block's pool,
 * an inc waits until the pool holds what it takes.  Only the block's own
 * decs fill the pool (PTX ISA: "a pool of available registers is
 * maintained per-CTA"), so an inc the decs cannot cover never completes:
 * on a GPU the kernel hangs, here it is reported as a deadlock. */
static inline void setmaxnreg(bool inc, int count)
{
    Block *b = g_block;
    if (g_cur->lane != 0) return;
    int &cur = b->warp_regs[g_cur->warp];
    if (!cur) cur = launch_regs(b->n);
    if (count % 8 || count < 24 || count > 256 || (inc ? count < cur : count > cur))
        die(inc ? "setmaxnreg.inc to fewer registers than the warp has, or not a multiple of 8 in [24, 256]"
                : "setmaxnreg.dec to more registers than the warp has, or not a multiple of 8 in [24, 256]");
    if (!inc) {
        b->reg_pool += 32 * (cur - count);
        cur = count;
        return;
    }
    while (b->reg_pool < 32 * (count - cur))
        wait_turn("setmaxnreg.inc waits for registers the block's decs never give back (a deadlock on a GPU)");
    b->reg_pool -= 32 * (count - cur);
    b->cluster->spins = 0;   /* progress, as a completed mbarrier phase */
    cur = count;
}

/* A box of the 2-D tensor map at (c0 inner, c1 outer) into block b's
 * shared memory at dst, rows of box[0] elements one after another, in the
 * map's swizzle (the 16-byte chunk index XORed with shared-address bits
 * 7..9); elements past the tensor read as zeros; then the bytes complete
 * on b's mbarrier at mbar. */
static inline void tma_box_2d(Block *b, unsigned dst, const EmuTensorMap &t, int c0, int c1, unsigned mbar)
{
    unsigned row_bytes = t.box[0] * t.element_bytes;
    for (unsigned r = 0; r < t.box[1]; r++) {
        for (unsigned byte = 0; byte < row_bytes; byte += t.element_bytes) {
            unsigned addr = dst + r * row_bytes + byte;
            if (t.swizzle_bytes) addr ^= ((addr >> 7) & 7u) << 4;
            long long x = (long long)c0 + byte / t.element_bytes, y = (long long)c1 + r;
            if (addr >= SHARED_BYTES) die("a TMA box past the block's shared memory");
            unsigned char *out = b->window + addr;
            if (x < 0 || y < 0 || (unsigned long long)x >= t.dim[0] || (unsigned long long)y >= t.dim[1])
                memset(out, 0, t.element_bytes);
            else
                memcpy(out, (const unsigned char *)(uintptr_t)t.address + (unsigned long long)y * t.outer_stride +
                                (unsigned long long)x * t.element_bytes,
                       t.element_bytes);
        }
    }
    Block::Mbar *m = mbar_at(b, mbar, 0);
    m->tx -= (long long)row_bytes * t.box[1];
    mbar_check(m);
}

static inline EmuTensorMap tensor_map(const void *map)
{
    EmuTensorMap t;
    memcpy(&t, map, sizeof t);
    if (t.magic != EMU_TMAP_MAGIC) die("cp.async.bulk.tensor with a tensor map cuTensorMapEncodeTiled did not make");
    return t;
}

/* dst and mbar are shared::cluster addresses, in one block (a shared::cta
 * address: this one). */
static inline void tma_load_2d(unsigned dst, const void *map, int c0, int c1, unsigned mbar)
{
    unsigned dst_offset, mbar_offset;
    Block *b = cluster_block(dst, &dst_offset);
    if (cluster_block(mbar, &mbar_offset) != b)
        die("cp.async.bulk.tensor: the mbarrier is not in the destination's block");
    if (b != g_block) require_running(b, "cp.async.bulk.tensor");
    tma_box_2d(b, dst_offset, tensor_map(map), c0, c1, mbar_offset);
}

/* .multicast::cluster: the same box at offset dst of every block whose
 * rank's bit is set in mask, its bytes completing on the mbarrier at
 * offset mbar of each. */
static inline void tma_load_2d_multicast(unsigned dst, const void *map, int c0, int c1, unsigned mbar, unsigned mask)
{
    const EmuTensorMap t = tensor_map(map);
    Cluster *c = g_block->cluster;
    unsigned dst_offset, mbar_offset;
    cluster_block(dst, &dst_offset);   /* the offsets apply in every block */
    cluster_block(mbar, &mbar_offset);
    if (mask & 0xffffu & ~((1u << c->n) - 1)) die("cp.async.bulk.tensor multicast to a rank outside the cluster");
    for (int r = 0; r < c->n; r++) {
        if (!(mask >> r & 1u)) continue;
        require_running(c->blocks[r], "cp.async.bulk.tensor multicast");
        tma_box_2d(c->blocks[r], dst_offset, t, c0, c1, mbar_offset);
    }
}

/* cp.async.bulk.tensor.2d.global.shared::cta: the box at (c0, c1) of the
 * tensor from this block's shared memory at src (the inverse of
 * tma_box_2d's reading, swizzle included); elements past the tensor are
 * not written.  Queued until the issuing thread's next
 * cp.async.bulk.wait_group (bulk_wait), as Block::stores says. */
static inline void tma_store_2d(const void *map, int c0, int c1, unsigned src)
{
    Block *b = g_block;
    unsigned src_offset;
    if (cluster_block(src, &src_offset) != b) die("cp.async.bulk.tensor store from another block's shared memory");
    if (b->n_stores == (int)(sizeof b->stores / sizeof b->stores[0]))
        die("more than 32 TMA stores of a block waiting for cp.async.bulk.wait_group");
    b->stores[b->n_stores++] = Block::PendingStore{g_cur->linear, tensor_map(map), c0, c1, src_offset, 0};
}

static inline void tma_store_now(const Block *b, const Block::PendingStore &s)
{
    const EmuTensorMap &t = s.t;
    unsigned row_bytes = t.box[0] * t.element_bytes;
    for (unsigned r = 0; r < t.box[1]; r++) {
        for (unsigned byte = 0; byte < row_bytes; byte += t.element_bytes) {
            unsigned addr = s.src + r * row_bytes + byte;
            if (t.swizzle_bytes) addr ^= ((addr >> 7) & 7u) << 4;
            long long x = (long long)s.c0 + byte / t.element_bytes, y = (long long)s.c1 + r;
            if (addr >= SHARED_BYTES) die("a TMA store's box past the block's shared memory");
            if (x < 0 || y < 0 || (unsigned long long)x >= t.dim[0] || (unsigned long long)y >= t.dim[1]) continue;
            memcpy((unsigned char *)(uintptr_t)t.address + (unsigned long long)y * t.outer_stride +
                       (unsigned long long)x * t.element_bytes,
                   b->window + addr, t.element_bytes);
        }
    }
}

/* cp.async.bulk.commit_group: this thread's uncommitted stores become its
 * newest group. */
static inline void bulk_commit(void)
{
    Block *b = g_block;
    unsigned group = ++b->bulk_groups[g_cur->linear];
    for (int i = 0; i < b->n_stores; i++)
        if (b->stores[i].thread == g_cur->linear && b->stores[i].group == 0) b->stores[i].group = group;
}

/* cp.async.bulk.wait_group[.read] N: this thread's queued TMA stores, in the
 * order issued, but those of its newest `keep_newest` committed groups
 * (N = 0: all of them, committed or not). */
static inline void bulk_wait(unsigned keep_newest)
{
    Block *b = g_block;
    const unsigned latest = b->bulk_groups[g_cur->linear];
    int kept = 0;
    for (int i = 0; i < b->n_stores; i++) {
        const Block::PendingStore &st = b->stores[i];
        bool mine = st.thread == g_cur->linear;
        bool done = mine && (keep_newest == 0 || (st.group != 0 && st.group + keep_newest <= latest));
        if (done) tma_store_now(b, st);
        else b->stores[kept++] = st;
    }
    b->n_stores = kept;
}

}   /* namespace emu */

static inline unsigned __cvta_generic_to_shared(const void *p) { return emu::to_shared(p); }
/* `extern __shared__ T name[];` becomes a pointer to this (emu_asm.c) */
static inline void *emu_dynamic_shared(void) { return emu::g_window; }
/* `__shared__ T name...;` becomes a reference to this (emu_asm.c) */
static inline void *emu_shared_var(int site, size_t bytes, size_t align) { return emu::shared_var(site, bytes, align); }

static inline void emu_asm_cvt_f32_f16(float &f, unsigned short h) { f = emu::half_to_float(h); }
static inline void emu_asm_cvt_rn_f16_f32(unsigned short &h, float f) { h = emu::float_to_half_rn(f); }
static inline void emu_asm_cvt_rn_bf16_f32(unsigned short &h, float f) { h = emu::float_to_bf16_rn(f); }
static inline void emu_asm_cvt_rn_f16x2_f32(unsigned &r, float hi, float lo)
{
    r = (unsigned)emu::float_to_half_rn(lo) | (unsigned)emu::float_to_half_rn(hi) << 16;
}
static inline void emu_asm_cvt_rn_bf16x2_f32(unsigned &r, float hi, float lo)
{
    r = (unsigned)emu::float_to_bf16_rn(lo) | (unsigned)emu::float_to_bf16_rn(hi) << 16;
}
static inline void emu_asm_ex2_approx_ftz_f32(float &y, float x) { y = emu::ftz(exp2f(emu::ftz(x))); }
static inline void emu_asm_rcp_approx_ftz_f32(float &y, float x) { y = emu::ftz(1.0f / emu::ftz(x)); }
static inline void emu_asm_mma_16816_f16(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1,
                                         unsigned a2, unsigned a3, unsigned b0, unsigned b1)
{
    float c[4] = {c0, c1, c2, c3};
    unsigned a[4] = {a0, a1, a2, a3};
    emu::mma_16816(c, a, b0, b1, 0);
    c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
}
static inline void emu_asm_mma_16816_bf16(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1,
                                          unsigned a2, unsigned a3, unsigned b0, unsigned b1)
{
    float c[4] = {c0, c1, c2, c3};
    unsigned a[4] = {a0, a1, a2, a3};
    emu::mma_16816(c, a, b0, b1, 1);
    c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
}
static inline void emu_asm_ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned addr)
{
    unsigned r[4];
    emu::ldmatrix_x4(r, (const unsigned short *)emu::from_shared(addr), 0);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
static inline void emu_asm_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3)
{
    const unsigned r[4] = {r0, r1, r2, r3};
    emu::stmatrix_x4((unsigned short *)emu::from_shared(addr), r);
}
static inline void emu_asm_ldmatrix_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned addr)
{
    unsigned r[4];
    emu::ldmatrix_x4(r, (const unsigned short *)emu::from_shared(addr), 1);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
/* cp.async with a source size: the bytes past it are zeros. */
static inline void emu_cp_async(unsigned dst, const void *src, int bytes, int src_bytes)
{
    unsigned char *d = (unsigned char *)emu::from_shared(dst);
    if (src_bytes < 0 || src_bytes > bytes) emu::die("cp.async: source size past the copy");
    memcpy(d, src, (size_t)src_bytes);
    memset(d + src_bytes, 0, (size_t)(bytes - src_bytes));
}
static inline void emu_asm_cp_async16(unsigned dst, const void *src, int n) { emu_cp_async(dst, src, 16, n); }
static inline void emu_asm_cp_async4(unsigned dst, const void *src, int n) { emu_cp_async(dst, src, 4, n); }
static inline void emu_asm_nothing(void) {}
static inline void emu_asm_setmaxnreg(bool inc, int count) { emu::setmaxnreg(inc, count); }
static inline void emu_asm_mbar_init(unsigned addr, int count) { emu::mbar_init(addr, count); }
static inline void emu_asm_mbar_arrive(unsigned addr) { emu::mbar_arrive(emu::g_block, addr, 0); }
static inline void emu_asm_mbar_arrive_expect_tx(unsigned addr, unsigned bytes)
{
    emu::mbar_arrive(emu::g_block, addr, bytes);
}
static inline void emu_asm_mbar_try_wait(unsigned &ok, unsigned addr, unsigned parity) { ok = emu::mbar_try_wait(addr, parity); }
static inline void emu_asm_tma_load_2d(unsigned dst, unsigned long long map, int c0, int c1, unsigned mbar)
{
    emu::tma_load_2d(dst, (const void *)(uintptr_t)map, c0, c1, mbar);
}
static inline void emu_asm_tma_store_2d(unsigned long long map, int c0, int c1, unsigned src)
{
    emu::tma_store_2d((const void *)(uintptr_t)map, c0, c1, src);
}
static inline void emu_asm_bulk_wait(void) { emu::bulk_wait(0); }
static inline void emu_asm_bulk_wait_but_last(void) { emu::bulk_wait(1); }
static inline void emu_asm_bulk_commit(void) { emu::bulk_commit(); }
/* ---- clusters (__cluster_dims__) ---- */
static inline void emu_asm_cluster_ctarank(unsigned &rank) { rank = emu::g_block->rank; }
static inline void emu_asm_cluster_nctarank(unsigned &n) { n = (unsigned)emu::g_block->cluster->n; }
static inline void emu_asm_mapa(unsigned &remote, unsigned addr, unsigned rank) { remote = emu::mapa(addr, rank); }
static inline void emu_asm_mbar_arrive_cluster(unsigned addr) { emu::mbar_arrive_cluster(addr); }
static inline void emu_asm_tma_load_2d_multicast(unsigned dst, unsigned long long map, int c0, int c1, unsigned mbar,
                                                 unsigned short mask)
{
    emu::tma_load_2d_multicast(dst, (const void *)(uintptr_t)map, c0, c1, mbar, mask);
}
static inline void emu_asm_cluster_arrive(void) { emu::cluster_arrive(); }
static inline void emu_asm_cluster_wait(void) { emu::cluster_wait(); }
static inline void emu_asm_cluster_sync(void)
{
    emu::cluster_arrive();
    emu::cluster_wait();
}
static inline void emu_wgmma(float *const *d, int n, int bf16, int a_regs, unsigned long long desc_a, const unsigned a[4],
                             unsigned long long desc_b, int scale_d, int scale_a, int scale_b, int trans_a, int trans_b)
{
    emu::wgmma_run(d, n, bf16, a_regs, desc_a, a, desc_b, scale_d, scale_a, scale_b, trans_a, trans_b);
}
static inline void emu_asm_st_global_v4_b32(void *p, unsigned x, unsigned y, unsigned z, unsigned w)
{
    unsigned v[4] = {x, y, z, w};
    memcpy(p, v, 16);
}
[[noreturn]] static inline void emu_asm_unknown(const char *ptx)
{
    char what[400];
    snprintf(what, sizeof what, "inline PTX the emulator does not implement: \"%s\"", ptx);
    emu::die(what);
}

#endif
