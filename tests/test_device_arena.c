/* tests/test_device_arena.c — arena_alloc_packed (runtime/cuda/device_arena.h)
 * without a GPU: through a caller's allocator that records its calls, the
 * buffers of one packed allocation come from ONE allocation, each at an
 * ARENA_ALIGN offset, none overlapping another, zero-sized ones 0; the
 * arena counts the block once, and one arena_release returns it. */
#include <criterion/criterion.h>
#include <string.h>

#include "cuda/device_arena.h"

typedef struct {
    int allocs, frees;
    size_t last_bytes;
    CUdeviceptr last_freed;
    CUdeviceptr next;
} FakeDevice;

static CUdeviceptr fake_alloc(void *user, size_t bytes)
{
    FakeDevice *d = user;
    d->allocs++;
    d->last_bytes = bytes;
    CUdeviceptr p = d->next;
    d->next += (bytes + 0xfffff) / 0x100000 * 0x100000 + 0x100000;   /* far apart, 1 MiB aligned */
    return p;
}

static void fake_free(void *user, CUdeviceptr ptr)
{
    FakeDevice *d = user;
    d->frees++;
    d->last_freed = ptr;
}

Test(device_arena, packed_buffers_share_one_allocation)
{
    FakeDevice dev = {.next = 0x7f0000000000ull};
    ArenaAllocator al = {.alloc = fake_alloc, .free = fake_free, .user = &dev};
    DeviceArena a;
    HpcError err = {0};
    cr_assert_eq(arena_init_with(&a, &al, "plan", 4096, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(dev.allocs, 1);
    const size_t bytes[] = {3, 0, 256, 1000, 2359296, 8};
    const int n = (int)(sizeof bytes / sizeof bytes[0]);
    CUdeviceptr ptrs[6], block = 0;
    cr_assert_eq(arena_alloc_packed(&a, &block, ptrs, bytes, n, "parameters", &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(dev.allocs, 2, "one allocation for %d buffers, not %d", n, dev.allocs - 1);
    size_t want = 256 + 0 + 256 + 1024 + 2359296 + 256;
    cr_assert_eq(dev.last_bytes, want, "block of %zu bytes, expected %zu", dev.last_bytes, want);
    cr_assert_neq(block, 0);
    cr_assert_eq(ptrs[1], 0, "a zero-sized buffer gets no pointer");
    CUdeviceptr end = block;
    for (int i = 0; i < n; i++) {
        if (!bytes[i]) continue;
        cr_assert_eq((ptrs[i] - block) % ARENA_ALIGN, 0, "buffer %d at offset %llu", i,
                     (unsigned long long)(ptrs[i] - block));
        cr_assert_geq(ptrs[i], end, "buffer %d overlaps the one before", i);
        end = ptrs[i] + bytes[i];
    }
    cr_assert_leq(end, block + want, "the last buffer ends past the block");
    ArenaStats s;
    arena_stats(&a, &s);
    cr_assert_eq(s.odd_bytes, want, "the arena counts %zu odd bytes, expected %zu", s.odd_bytes, want);
    cr_assert_eq(s.peak_bytes, 4096 + want);
    arena_release(&a, block);
    cr_assert_eq(dev.frees, 1);
    cr_assert_eq(dev.last_freed, block);
    arena_stats(&a, &s);
    cr_assert_eq(s.odd_bytes, 0);
    arena_free(&a);
    cr_assert_eq(dev.frees, 2, "arena_free returns the planned block");
}

Test(device_arena, packed_nothing_allocates_nothing)
{
    FakeDevice dev = {.next = 0x10000};
    ArenaAllocator al = {.alloc = fake_alloc, .free = fake_free, .user = &dev};
    DeviceArena a;
    HpcError err = {0};
    cr_assert_eq(arena_init_with(&a, &al, "plan", 0, &err), HPC_OK, "%s", err.msg);
    const size_t bytes[] = {0, 0};
    CUdeviceptr ptrs[2] = {1, 1}, block = 1;
    cr_assert_eq(arena_alloc_packed(&a, &block, ptrs, bytes, 2, "nothing", &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(block, 0);
    cr_assert_eq(ptrs[0], 0);
    cr_assert_eq(ptrs[1], 0);
    cr_assert_eq(dev.allocs, 0, "no allocation for no bytes");
    arena_free(&a);
}

static CUdeviceptr refusing_alloc(void *user, size_t bytes)
{
    (void)user;
    (void)bytes;
    return 0;
}

Test(device_arena, packed_out_of_memory_names_the_buffers)
{
    FakeDevice dev = {0};
    ArenaAllocator al = {.alloc = refusing_alloc, .free = fake_free, .user = &dev};
    DeviceArena a;
    HpcError err = {0};
    cr_assert_eq(arena_init_with(&a, &al, "plan", 0, &err), HPC_OK, "%s", err.msg);
    const size_t bytes[] = {1024, 4096};
    CUdeviceptr ptrs[2] = {1, 1}, block = 1;
    cr_assert_eq(arena_alloc_packed(&a, &block, ptrs, bytes, 2, "optimizer m", &err), HPC_ERR_OOM);
    cr_assert(strstr(err.msg, "optimizer m") != NULL, "message: %s", err.msg);
    cr_assert_eq(ptrs[0], 0);
    cr_assert_eq(ptrs[1], 0);
    arena_free(&a);
}
