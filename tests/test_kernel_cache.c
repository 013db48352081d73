/* tests/test_kernel_cache.c — the on-disk cubin cache: SHA-256 known
 * answers, keys that change with every input, damaged entries detected,
 * concurrent writers. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/kernel_cache.h"

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/hpc-kcache-test-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

static void hex(const uint8_t *b, int n, char *out)
{
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* Known answers from FIPS 180-2, appendix B. */
Test(kcache, sha256_known_answers)
{
    uint8_t d[32];
    char h[65];
    kcache_sha256("abc", 3, d);
    hex(d, 32, h);
    cr_expect_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kcache_sha256(two, strlen(two), d);
    hex(d, 32, h);
    cr_expect_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    kcache_sha256("", 0, d);
    hex(d, 32, h);
    cr_expect_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

/* One million 'a' (FIPS 180-2 B.3): exercises many blocks. */
Test(kcache, sha256_million_a)
{
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    uint8_t d[32];
    char h[65];
    kcache_sha256(a, n, d);
    hex(d, 32, h);
    cr_expect_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

static int key_eq(const KcacheKey *a, const KcacheKey *b) { return !memcmp(a->b, b->b, 32); }

Test(kcache, key_depends_on_every_input)
{
    const char *o1[] = {"-DH=768", "--use_fast_math"};
    const char *o2[] = {"-DH=1024", "--use_fast_math"};
    const char *o3[] = {"--use_fast_math", "-DH=768"};
    const char *split[] = {"-a", "b"}, *joined[] = {"-ab"};
    KcacheKey base, k;
    kcache_key(&base, "kernel A", o1, 2, 90, 13000);
    kcache_key(&k, "kernel A", o1, 2, 90, 13000);
    cr_expect(key_eq(&base, &k), "same inputs, same key");
    kcache_key(&k, "kernel B", o1, 2, 90, 13000);
    cr_expect(!key_eq(&base, &k), "source");
    kcache_key(&k, "kernel A", o2, 2, 90, 13000);
    cr_expect(!key_eq(&base, &k), "option value");
    kcache_key(&k, "kernel A", o3, 2, 90, 13000);
    cr_expect(!key_eq(&base, &k), "option order");
    kcache_key(&k, "kernel A", o1, 1, 90, 13000);
    cr_expect(!key_eq(&base, &k), "option count");
    kcache_key(&k, "kernel A", o1, 2, 80, 13000);
    cr_expect(!key_eq(&base, &k), "arch");
    kcache_key(&k, "kernel A", o1, 2, 90, 12080);
    cr_expect(!key_eq(&base, &k), "nvrtc version");
    KcacheKey ks, kj;
    kcache_key(&ks, "k", split, 2, 90, 13000);
    kcache_key(&kj, "k", joined, 1, 90, 13000);
    cr_expect(!key_eq(&ks, &kj), "option boundaries are part of the key");
    kcache_key(&ks, "k-a", NULL, 0, 90, 13000);
    kcache_key(&kj, "k", (const char *[]){"-a"}, 1, 90, 13000);
    cr_expect(!key_eq(&ks, &kj), "source/option boundary is part of the key");
}

static void random_payload(uint8_t *p, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rand() >> 7);
}

static void store_ok(const KcacheKey *key, const void *data, size_t n)
{
    HpcError err;
    HpcStatus st = kcache_store(g_dir, key, data, n, &err);
    cr_assert_eq(st, HPC_OK, "store: %s", err.msg);
}

static KcacheResult load(const KcacheKey *key, void **data, size_t *n)
{
    HpcError err;
    KcacheResult r;
    HpcStatus st = kcache_load(g_dir, key, data, n, &r, &err);
    cr_assert_eq(st, HPC_OK, "load: %s", err.msg);
    return r;
}

Test(kcache, roundtrip_and_miss, .init = make_dir, .fini = remove_dir)
{
    KcacheKey key, other;
    kcache_key(&key, "src", NULL, 0, 90, 13000);
    kcache_key(&other, "src2", NULL, 0, 90, 13000);
    uint8_t payload[5000];
    random_payload(payload, sizeof payload, 7);
    void *data;
    size_t n;
    cr_expect_eq(load(&key, &data, &n), KCACHE_MISS);
    cr_expect_null(data);
    store_ok(&key, payload, sizeof payload);
    cr_assert_eq(load(&key, &data, &n), KCACHE_HIT);
    cr_expect_eq(n, sizeof payload);
    cr_expect_eq(memcmp(data, payload, n), 0);
    free(data);
    cr_expect_eq(load(&other, &data, &n), KCACHE_MISS);
}

/* Damages the stored entry with `damage`, expects CORRUPT, then a fresh
 * store must read back whole again. */
static void check_damage(void (*damage)(const char *path, size_t size), const char *what)
{
    KcacheKey key;
    kcache_key(&key, what, NULL, 0, 80, 13000);
    uint8_t payload[3000];
    random_payload(payload, sizeof payload, 11);
    store_ok(&key, payload, sizeof payload);
    char path[KCACHE_PATH_MAX];
    kcache_entry_path(path, sizeof path, g_dir, &key);
    damage(path, KCACHE_HEADER_BYTES + sizeof payload);
    void *data;
    size_t n;
    cr_expect_eq(load(&key, &data, &n), KCACHE_CORRUPT, "%s not detected", what);
    cr_expect_null(data);
    store_ok(&key, payload, sizeof payload);
    cr_assert_eq(load(&key, &data, &n), KCACHE_HIT, "%s: not replaced", what);
    cr_expect_eq(n, sizeof payload);
    cr_expect_eq(memcmp(data, payload, n), 0);
    free(data);
}

static void flip_byte_at(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void truncate_half(const char *path, size_t size) { cr_assert_eq(truncate(path, (off_t)size / 2), 0); }
static void truncate_one(const char *path, size_t size) { cr_assert_eq(truncate(path, (off_t)size - 1), 0); }
static void truncate_empty(const char *path, size_t size) { cr_assert_eq(truncate(path, 0), 0); }
static void truncate_header(const char *path, size_t size) { cr_assert_eq(truncate(path, 40), 0); }
static void flip_payload(const char *path, size_t size) { flip_byte_at(path, (long)size - 17); }
static void flip_magic(const char *path, size_t size) { flip_byte_at(path, 2); }
static void flip_length(const char *path, size_t size) { flip_byte_at(path, 17); }
static void flip_checksum(const char *path, size_t size) { flip_byte_at(path, 60); }
static void append_byte(const char *path, size_t size)
{
    FILE *f = fopen(path, "ab");
    cr_assert_not_null(f);
    fputc(0, f);
    fclose(f);
}

Test(kcache, damage_detected_and_replaced, .init = make_dir, .fini = remove_dir)
{
    check_damage(truncate_half, "truncated to half");
    check_damage(truncate_one, "one byte short");
    check_damage(truncate_empty, "empty file");
    check_damage(truncate_header, "partial header");
    check_damage(flip_payload, "flipped payload byte");
    check_damage(flip_magic, "bad magic");
    check_damage(flip_length, "wrong length field");
    check_damage(flip_checksum, "checksum field");
    check_damage(append_byte, "trailing garbage");
}

/* An intact entry filed under another key's name is not that key's cubin. */
Test(kcache, entry_under_wrong_key, .init = make_dir, .fini = remove_dir)
{
    KcacheKey a, b;
    kcache_key(&a, "a", NULL, 0, 90, 13000);
    kcache_key(&b, "b", NULL, 0, 90, 13000);
    uint8_t payload[100];
    random_payload(payload, sizeof payload, 3);
    store_ok(&a, payload, sizeof payload);
    char pa[KCACHE_PATH_MAX], pb[KCACHE_PATH_MAX];
    kcache_entry_path(pa, sizeof pa, g_dir, &a);
    kcache_entry_path(pb, sizeof pb, g_dir, &b);
    cr_assert_eq(link(pa, pb), 0);
    void *data;
    size_t n;
    cr_expect_eq(load(&b, &data, &n), KCACHE_CORRUPT);
}

/* Writers race on one key with different payloads while readers read: a
 * reader sees a miss or one whole payload, never a damaged entry, and the
 * survivor is one writer's payload exactly; no temporary files remain. */
Test(kcache, concurrent_writers, .init = make_dir, .fini = remove_dir)
{
    enum { WRITERS = 8, ROUNDS = 40, SIZE = 200000 };
    KcacheKey key;
    kcache_key(&key, "raced", NULL, 0, 90, 13000);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        cr_assert_neq(pids[w], -1);
        if (pids[w] != 0) continue;
        uint8_t *mine = malloc(SIZE);
        random_payload(mine, SIZE, 100 + (unsigned)w);
        int bad = 0;
        for (int r = 0; r < ROUNDS; r++) {
            HpcError err;
            KcacheResult res;
            void *data;
            size_t n;
            if (kcache_store(g_dir, &key, mine, SIZE, &err) != HPC_OK) bad = 1;
            if (kcache_load(g_dir, &key, &data, &n, &res, &err) != HPC_OK) bad = 1;
            if (res == KCACHE_CORRUPT || (res == KCACHE_HIT && n != SIZE)) bad = 1;
            free(data);
        }
        free(mine);
        _exit(bad);
    }
    for (int w = 0; w < WRITERS; w++) {
        int status;
        cr_assert_eq(waitpid(pids[w], &status, 0), pids[w]);
        cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d saw a bad entry", w);
    }
    void *data;
    size_t n;
    cr_assert_eq(load(&key, &data, &n), KCACHE_HIT);
    cr_assert_eq(n, (size_t)SIZE);
    int matches = 0;
    uint8_t *ref = malloc(SIZE);
    for (int w = 0; w < WRITERS; w++) {
        random_payload(ref, SIZE, 100 + (unsigned)w);
        matches += memcmp(ref, data, SIZE) == 0;
    }
    cr_expect_eq(matches, 1, "the entry is exactly one writer's payload");
    free(ref);
    free(data);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s/kernels' | wc -l) -eq 1", g_dir);
    cr_expect_eq(system(cmd), 0, "temporary files left behind");
}

Test(kcache, dir_from_environment, .init = make_dir, .fini = remove_dir)
{
    char dir[KCACHE_PATH_MAX], want[400];
    HpcError err;
    snprintf(want, sizeof want, "%s/explicit/sub", g_dir);
    setenv("HPC_CACHE_DIR", want, 1);
    cr_assert_eq(kcache_dir(dir, sizeof dir, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(dir, want);
    struct stat st;
    cr_expect_eq(stat(want, &st), 0, "directory created");
    unsetenv("HPC_CACHE_DIR");
    snprintf(want, sizeof want, "%s/xdg", g_dir);
    setenv("XDG_CACHE_HOME", want, 1);
    cr_assert_eq(kcache_dir(dir, sizeof dir, &err), HPC_OK, "%s", err.msg);
    strcat(want, "/hpc");
    cr_expect_str_eq(dir, want);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", g_dir, 1);
    cr_assert_eq(kcache_dir(dir, sizeof dir, &err), HPC_OK, "%s", err.msg);
    snprintf(want, sizeof want, "%s/.cache/hpc", g_dir);
    cr_expect_str_eq(dir, want);
}

Test(kcache, unwritable_dir_is_an_io_error)
{
    HpcError err;
    char dir[KCACHE_PATH_MAX];
    setenv("HPC_CACHE_DIR", "/dev/null/cache", 1);
    cr_expect_eq(kcache_dir(dir, sizeof dir, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "/dev/null") && strstr(err.msg, "HPC_CACHE_DIR"), "%s", err.msg);
    KcacheKey key;
    kcache_key(&key, "x", NULL, 0, 90, 13000);
    cr_expect_eq(kcache_store("/dev/null/cache", &key, "abc", 3, &err), HPC_ERR_IO);
}
