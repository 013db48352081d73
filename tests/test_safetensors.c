/* tests/test_safetensors.c — round trips through st_writer_save/st_open for
 * every dtype hpc uses, the on-disk layout the format prescribes, and one
 * hostile file per validation rule (each must fail with a message naming
 * the tensor or the broken rule, without crashing or allocating much). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cpu/philox.h"
#include "formats/safetensors.h"

/* Random bytes from Philox: reproducible, never all zeros. */
static void fill_random(void *buf, size_t n, uint32_t salt)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(philox_uniform(7, i, 0, salt) * 256.0f);
}

static char *temp_path(const char *tag)
{
    char *path = malloc(256);
    snprintf(path, 256, "/tmp/hpc_test_st_%d_%s.safetensors", (int)getpid(), tag);
    return path;
}

static void roundtrip_dtype(StDtype dt, uint32_t salt)
{
    HpcError err = {0};
    int64_t shape[3] = {3, 5, 7};
    size_t nbytes = 3 * 5 * 7 * st_dtype_size(dt);
    void *data = malloc(nbytes);
    fill_random(data, nbytes, salt);
    StWriter w;
    st_writer_init(&w);
    cr_assert_eq(st_writer_add(&w, "layer.0.weight", dt, 3, shape, data, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(st_writer_meta(&w, "format", "pt", &err), HPC_OK);
    char *path = temp_path(st_dtype_name(dt));
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK, "%s", err.msg);
    st_writer_free(&w);

    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(st_count(f), 1);
    const StTensor *t = st_find(f, "layer.0.weight");
    cr_assert_not_null(t);
    cr_expect_eq(t->dtype, dt);
    cr_expect_eq(t->ndim, 3);
    cr_expect(t->shape[0] == 3 && t->shape[1] == 5 && t->shape[2] == 7);
    cr_expect_eq(t->nbytes, nbytes);
    cr_expect_eq(t->numel, 105u);
    cr_expect_eq(memcmp(t->data, data, nbytes), 0, "%s data differs after the round trip", st_dtype_name(dt));
    cr_expect_eq((uintptr_t)t->data % st_dtype_size(dt), 0u, "data not aligned");
    cr_expect_str_eq(st_metadata_get(f, "format"), "pt");
    cr_expect_null(st_find(f, "layer.0.bias"));
    st_close(f);
    unlink(path);
    free(path);
    free(data);
}

Test(safetensors, roundtrip_f32) { roundtrip_dtype(ST_F32, 1); }
Test(safetensors, roundtrip_f16) { roundtrip_dtype(ST_F16, 2); }
Test(safetensors, roundtrip_bf16) { roundtrip_dtype(ST_BF16, 3); }
Test(safetensors, roundtrip_f64) { roundtrip_dtype(ST_F64, 4); }
Test(safetensors, roundtrip_i32) { roundtrip_dtype(ST_I32, 5); }
Test(safetensors, roundtrip_i64) { roundtrip_dtype(ST_I64, 6); }

/* Many tensors of mixed dtypes, a scalar and an empty one: the layout must
 * be 8 + N + data with N % 8 == 0, a space-padded header, each tensor
 * aligned, and every tensor must come back bitwise. */
Test(safetensors, roundtrip_mixed_layout)
{
    HpcError err = {0};
    enum { K = 7 };
    StDtype dts[K] = {ST_F16, ST_F64, ST_I32, ST_BF16, ST_F32, ST_I64, ST_U8};
    int64_t shapes[K][2] = {{3, 1}, {2, 3}, {5, 1}, {1, 7}, {0, 4}, {1, 1}, {3, 3}};
    int ndims[K] = {2, 2, 1, 2, 2, 0, 2};
    char names[K][16];
    void *bufs[K];
    StWriter w;
    st_writer_init(&w);
    for (int k = 0; k < K; k++) {
        snprintf(names[k], sizeof names[k], "t%d", k);
        size_t n = (size_t)(shapes[k][0] * shapes[k][1]) * st_dtype_size(dts[k]);
        bufs[k] = malloc(n + 1);
        fill_random(bufs[k], n, 100 + (uint32_t)k);
        cr_assert_eq(st_writer_add(&w, names[k], dts[k], ndims[k], shapes[k], bufs[k], &err), HPC_OK, "%s", err.msg);
    }
    char *path = temp_path("mixed");
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK, "%s", err.msg);

    FILE *fp = fopen(path, "rb");
    uint8_t head[8];
    cr_assert_eq(fread(head, 1, 8, fp), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | head[i];
    cr_expect_eq(n % 8, 0u, "header length %llu not a multiple of 8", (unsigned long long)n);
    char *hdr = calloc(1, n + 1);
    cr_assert_eq(fread(hdr, 1, n, fp), n);
    cr_expect_eq(hdr[0], '{');
    size_t json_end = strlen(hdr);
    while (json_end > 0 && hdr[json_end - 1] == ' ') json_end--;
    cr_expect_eq(hdr[json_end - 1], '}', "header must be JSON then spaces");
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fclose(fp);
    free(hdr);
    cr_expect_eq((uint64_t)size, 8 + n + 6 * 8 + 5 * 4 + 8 + 2 * 3 + 2 * 7 + 9, "file size %ld", size);

    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(st_count(f), K);
    for (int k = 0; k < K; k++) {
        const StTensor *t = st_find(f, names[k]);
        cr_assert_not_null(t, "%s missing", names[k]);
        cr_expect_eq(t->dtype, dts[k]);
        cr_expect_eq(t->ndim, ndims[k]);
        cr_expect_eq((uintptr_t)t->data % st_dtype_size(t->dtype), 0u, "%s not aligned", names[k]);
        cr_expect_eq(memcmp(t->data, bufs[k], (size_t)t->nbytes), 0, "%s differs", names[k]);
        free(bufs[k]);
    }
    /* st_tensor walks in data order: offsets must be increasing. */
    for (int64_t i = 1; i < st_count(f); i++)
        cr_expect((const uint8_t *)st_tensor(f, i)->data >= (const uint8_t *)st_tensor(f, i - 1)->data);
    st_close(f);
    st_writer_free(&w);
    unlink(path);
    free(path);
}

Test(safetensors, save_replaces_existing_file)
{
    HpcError err = {0};
    char *path = temp_path("replace");
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    int64_t s4 = 4, s2 = 2;
    StWriter w;
    st_writer_init(&w);
    st_writer_add(&w, "a", ST_F32, 1, &s4, a, &err);
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK, "%s", err.msg);
    st_writer_free(&w);
    st_writer_init(&w);
    st_writer_add(&w, "b", ST_F32, 1, &s2, b, &err);
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK, "%s", err.msg);
    st_writer_free(&w);
    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    cr_expect_null(st_find(f, "a"));
    cr_expect_not_null(st_find(f, "b"));
    st_close(f);
    unlink(path);
    free(path);
}

Test(safetensors, writer_rejects_bad_entries)
{
    HpcError err = {0};
    float x[2] = {1, 2};
    int64_t s = 2, neg = -1;
    StWriter w;
    st_writer_init(&w);
    cr_assert_eq(st_writer_add(&w, "x", ST_F32, 1, &s, x, &err), HPC_OK);
    cr_expect_eq(st_writer_add(&w, "x", ST_F32, 1, &s, x, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "added twice"), "%s", err.msg);
    cr_expect_eq(st_writer_add(&w, "__metadata__", ST_F32, 1, &s, x, &err), HPC_ERR_USAGE);
    cr_expect_eq(st_writer_add(&w, "y", ST_F32, 1, &neg, x, &err), HPC_ERR_USAGE);
    cr_expect_eq(st_writer_add(&w, "\xff\xfe", ST_F32, 1, &s, x, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "UTF-8"), "%s", err.msg);
    cr_expect_eq(st_writer_save(&w, "/nonexistent-dir/x.safetensors", &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent-dir"), "%s", err.msg);
    st_writer_free(&w);
}

/* ---------------------------------------------------------------- */
/* Hostile files                                                      */

/* Hostile input must not make the reader allocate in proportion to the
 * sizes it claims: cap the address space well below any claimed size. */
static void limit_memory(void)
{
    if (getenv("HPC_TEST_NO_RLIMIT")) return;   /* sanitizers reserve terabytes of address space */
    struct rlimit rl;
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long vm_kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "VmSize: %ld kB", &vm_kb) == 1) break;
    if (fp) fclose(fp);
    rl.rlim_cur = rl.rlim_max = (rlim_t)vm_kb * 1024 + ((rlim_t)512 << 20);
    setrlimit(RLIMIT_AS, &rl);
}

/* A file image: 8-byte length (explicit, may lie), header bytes, data. */
static uint8_t *image(uint64_t claimed_len, const char *hdr, size_t hdr_len, size_t data_len, size_t *total)
{
    *total = 8 + hdr_len + data_len;
    uint8_t *buf = calloc(1, *total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(claimed_len >> (8 * i));
    memcpy(buf + 8, hdr, hdr_len);
    fill_random(buf + 8 + hdr_len, data_len, 9);
    return buf;
}

/* Opens the image from memory and from a file; both must fail with a
 * message containing every needle. */
static void expect_reject_raw(uint64_t claimed, const char *hdr, size_t hdr_len, size_t data_len,
                              const char *needle1, const char *needle2)
{
    limit_memory();
    size_t total;
    uint8_t *buf = image(claimed, hdr, hdr_len, data_len, &total);
    HpcError err = {0};
    StFile *f = (StFile *)1;
    cr_assert_eq(st_open_memory(buf, total, "bad.safetensors", &f, &err), HPC_ERR_INPUT,
                 "accepted a hostile file: %.*s", (int)hdr_len, hdr);
    cr_expect_null(f);
    cr_expect(strstr(err.msg, "bad.safetensors"), "message lacks the file name: %s", err.msg);
    if (getenv("HPC_TEST_VERBOSE")) fprintf(stderr, "rejected: %.300s\n", err.msg);
    cr_expect(strstr(err.msg, needle1), "message lacks '%s': %s", needle1, err.msg);
    if (needle2) cr_expect(strstr(err.msg, needle2), "message lacks '%s': %s", needle2, err.msg);

    char *path = temp_path("hostile");
    FILE *fp = fopen(path, "wb");
    fwrite(buf, 1, total, fp);
    fclose(fp);
    HpcError err2 = {0};
    cr_expect_eq(st_open(path, &f, &err2), HPC_ERR_INPUT, "file form accepted");
    cr_expect(strstr(err2.msg, needle1), "file form: %s", err2.msg);
    unlink(path);
    free(path);
    free(buf);
}

static void expect_reject(const char *hdr, size_t data_len, const char *needle1, const char *needle2)
{
    expect_reject_raw(strlen(hdr), hdr, strlen(hdr), data_len, needle1, needle2);
}

Test(safetensors_hostile, accepts_the_valid_baseline)
{
    /* The hostile cases below are each one edit away from this file. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}";
    size_t total;
    uint8_t *buf = image(strlen(hdr), hdr, strlen(hdr), 16, &total);
    HpcError err = {0};
    StFile *f;
    cr_assert_eq(st_open_memory(buf, total, "ok", &f, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st_count(f), 2);
    cr_expect_eq(st_find(f, "b")->data, buf + 8 + strlen(hdr) + 8);
    st_close(f);
    free(buf);
}

Test(safetensors_hostile, too_short)
{
    HpcError err = {0};
    StFile *f;
    uint8_t four[4] = {1, 2, 3, 4};
    cr_expect_eq(st_open_memory(four, 4, "bad.safetensors", &f, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "too short"), "%s", err.msg);
}

Test(safetensors_hostile, header_length_past_end)
{
    const char *hdr = "{}";
    expect_reject_raw(4096, hdr, 2, 0, "runs past the end", NULL);
}

Test(safetensors_hostile, header_length_2_pow_63)
{
    const char *hdr = "{}";
    expect_reject_raw((uint64_t)1 << 63, hdr, 2, 0, "exceeds", "limit");
}

Test(safetensors_hostile, header_length_all_ones)
{
    expect_reject_raw(UINT64_MAX, "{}", 2, 0, "exceeds", NULL);
}

Test(safetensors_hostile, shape_2_pow_62_elements)
{
    /* 2^31 * 2^31 = 2^62 elements of 4 bytes: 2^64 bytes overflows. */
    expect_reject("{\"huge\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}",
                  8, "'huge'", "overflows");
}

Test(safetensors_hostile, shape_product_overflow_many_dims)
{
    expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}",
                  8, "'w'", "overflows");
}

Test(safetensors_hostile, huge_shape_with_matching_huge_offsets)
{
    /* Self-consistent sizes that the file does not hold: 2^40 bytes. */
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[268435456,1024],\"data_offsets\":[0,1099511627776]}}",
                  8, "'w'", "past the end");
}

Test(safetensors_hostile, overlapping_offsets)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  12, "overlap", "'a'");
}

Test(safetensors_hostile, identical_offsets)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                  8, "overlap", NULL);
}

Test(safetensors_hostile, gapped_offsets)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                  20, "'b'", "gap");
}

Test(safetensors_hostile, gap_at_start)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'a'", "gap");
}

Test(safetensors_hostile, data_not_covered)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 24, "16 trailing bytes",
                  NULL);
}

Test(safetensors_hostile, wrong_dtype_size)
{
    /* 3 F32 elements are 12 bytes, the offsets claim 8. */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'a'", "needs 12");
}

Test(safetensors_hostile, unknown_dtype)
{
    expect_reject("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'a'", "unknown dtype");
}

Test(safetensors_hostile, truncated_data)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10, "'a'", "truncated");
}

Test(safetensors_hostile, non_utf8_header)
{
    const char hdr[] = "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_reject(hdr, 8, "UTF-8", NULL);
}

Test(safetensors_hostile, overlong_utf8_header)
{
    const char hdr[] = "{\"\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_reject(hdr, 8, "UTF-8", NULL);
}

Test(safetensors_hostile, invalid_json)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "not valid JSON", NULL);
}

Test(safetensors_hostile, nul_in_header)
{
    const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}\0\0\0";
    expect_reject_raw(sizeof hdr - 1, hdr, sizeof hdr - 1, 8, "not valid JSON", NULL);
}

Test(safetensors_hostile, duplicate_names)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                  16, "duplicate", NULL);
}

Test(safetensors_hostile, non_object_header)
{
    expect_reject("[{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}]", 8, "must be a JSON object", NULL);
}

Test(safetensors_hostile, scalar_header)
{
    expect_reject("42", 8, "JSON", NULL);
}

Test(safetensors_hostile, entry_not_object)
{
    expect_reject("{\"a\":[1,2]}", 0, "'a'", "must be an object");
}

Test(safetensors_hostile, offsets_not_integers)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8, "'a'", "not an integer");
}

Test(safetensors_hostile, offsets_strings)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",\"8\"]}}", 8, "'a'",
                  "not an integer");
}

Test(safetensors_hostile, offsets_wrong_count)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "'a'", "[begin, end]");
}

Test(safetensors_hostile, offsets_reversed)
{
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "'a'", "end before");
}

Test(safetensors_hostile, negative_offset)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "'a'", "negative");
}

Test(safetensors_hostile, negative_dim)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,-1],\"data_offsets\":[0,8]}}", 8, "'a'", "negative");
}

Test(safetensors_hostile, integer_beyond_64_bits)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999999]}}", 8,
                  "JSON", NULL);
}

Test(safetensors_hostile, too_many_dims)
{
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "'a'",
                  "at most 8");
}

Test(safetensors_hostile, missing_dtype)
{
    expect_reject("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'a'", "dtype");
}

Test(safetensors_hostile, metadata_not_strings)
{
    expect_reject("{\"__metadata__\":{\"format\":1},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "__metadata__", "string");
}

Test(safetensors_hostile, long_name_is_cut_in_messages)
{
    size_t n = 100000;
    char *hdr = malloc(n + 200);
    strcpy(hdr, "{\"");
    memset(hdr + 2, 'x', n);
    strcpy(hdr + 2 + n, "\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}");
    expect_reject(hdr, 8, "needs 12", NULL);
    free(hdr);
}

Test(safetensors_hostile, directory_and_missing_file)
{
    HpcError err = {0};
    StFile *f;
    cr_expect_eq(st_open("/tmp", &f, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "/tmp"), "%s", err.msg);
    cr_expect_neq(st_open("/nonexistent/x.safetensors", &f, &err), HPC_OK);
    cr_expect(strstr(err.msg, "No such file"), "%s", err.msg);
}

/* ---------------------------------------------------------------- */
/* A file written by the reference implementation                     */

static float half_bits_to_f32(uint16_t h)
{
    /* Enough for the normal values the fixture holds (and zero). */
    if ((h & 0x7fff) == 0) return 0.0f;
    int e = (h >> 10) & 31;
    float m = 1.0f + (float)(h & 1023) / 1024.0f;
    return ldexpf(m, e - 15) * ((h & 0x8000) ? -1.0f : 1.0f);
}

Test(safetensors, reads_reference_implementation_file)
{
    /* tests/data/st/make_reference.py made this file with the Python
     * safetensors package; the values are the formulas written there. */
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/st/reference.safetensors", root ? root : ".");
    HpcError err = {0};
    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st_count(f), 6);
    cr_expect_str_eq(st_metadata_get(f, "format"), "np");

    const StTensor *x = st_find(f, "x");
    cr_assert(x && x->dtype == ST_F32 && x->ndim == 2 && x->shape[0] == 4 && x->shape[1] == 5);
    float xv[20];
    cr_assert_eq(st_tensor_copy(x, xv, sizeof xv, &err), HPC_OK);
    for (int k = 0; k < 20; k++) cr_expect_eq(xv[k], (float)k * 0.25f - 1.0f, "x[%d] = %g", k, xv[k]);

    const StTensor *y = st_find(f, "y");
    int64_t yv[3];
    cr_assert(y && y->dtype == ST_I64 && y->numel == 3);
    st_tensor_copy(y, yv, sizeof yv, &err);
    cr_expect(yv[0] == 10 && yv[1] == -3 && yv[2] == 7);

    const StTensor *z = st_find(f, "z");
    uint16_t zv[4];
    cr_assert(z && z->dtype == ST_F16 && z->ndim == 2 && z->numel == 4);
    st_tensor_copy(z, zv, sizeof zv, &err);
    for (int k = 0; k < 4; k++) cr_expect_eq(half_bits_to_f32(zv[k]), 0.5f * (float)k);

    const StTensor *d = st_find(f, "d");
    double dv[2];
    cr_assert(d && d->dtype == ST_F64);
    st_tensor_copy(d, dv, sizeof dv, &err);
    cr_expect(dv[0] == M_PI && dv[1] == -M_E);

    const StTensor *it = st_find(f, "i");
    int32_t iv[5];
    cr_assert(it && it->dtype == ST_I32 && it->numel == 5);
    st_tensor_copy(it, iv, sizeof iv, &err);
    for (int k = 0; k < 5; k++) cr_expect_eq(iv[k], k - 2);

    const StTensor *e = st_find(f, "empty");
    cr_assert(e && e->nbytes == 0 && e->shape[0] == 0 && e->shape[1] == 3);
    cr_expect_eq(st_tensor_copy(x, xv, 8, &err), HPC_ERR_USAGE, "copy into a short buffer must fail");
    st_close(f);
}

/* ---------------------------------------------------------------- */
/* Mutations of a valid file: every outcome is a clean accept (with all
 * data inside the buffer) or HPC_ERR_INPUT, never a crash. */

Test(safetensors_hostile, random_mutations_never_crash, .timeout = 60)
{
    limit_memory();
    HpcError err = {0};
    float a[6];
    int64_t b[2];
    uint16_t c[3];
    fill_random(a, sizeof a, 21);
    fill_random(b, sizeof b, 22);
    fill_random(c, sizeof c, 23);
    int64_t s6 = 6, s2 = 2, s3 = 3;
    StWriter w;
    st_writer_init(&w);
    st_writer_add(&w, "a", ST_F32, 1, &s6, a, &err);
    st_writer_add(&w, "b", ST_I64, 1, &s2, b, &err);
    st_writer_add(&w, "c", ST_BF16, 1, &s3, c, &err);
    st_writer_meta(&w, "k", "v", &err);
    char *path = temp_path("mutate");
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK);
    st_writer_free(&w);
    FILE *fp = fopen(path, "rb");
    uint8_t orig[512];
    size_t len = fread(orig, 1, sizeof orig, fp);
    fclose(fp);
    unlink(path);
    free(path);
    uint8_t buf[512];
    int accepted = 0;
    for (uint32_t iter = 0; iter < 20000; iter++) {
        memcpy(buf, orig, len);
        int edits = 1 + (int)(philox_uniform(11, iter, 0, 0) * 4);
        for (int e = 0; e < edits; e++) {
            size_t pos = (size_t)(philox_uniform(11, iter, (uint32_t)e + 1, 1) * (float)len) % len;
            buf[pos] = (uint8_t)(philox_uniform(11, iter, (uint32_t)e + 1, 2) * 256.0f);
        }
        size_t cut = philox_uniform(11, iter, 0, 3) < 0.1f ? (size_t)(philox_uniform(11, iter, 0, 4) * (float)len) : len;
        StFile *f;
        HpcStatus st = st_open_memory(buf, cut, "mutated", &f, &err);
        cr_assert(st == HPC_OK || st == HPC_ERR_INPUT, "status %d", st);
        if (st) continue;
        accepted++;
        for (int64_t i = 0; i < st_count(f); i++) {
            const StTensor *t = st_tensor(f, i);
            cr_assert((const uint8_t *)t->data >= buf && (const uint8_t *)t->data + t->nbytes <= buf + cut);
        }
        st_close(f);
    }
    cr_expect(accepted > 0 && accepted < 20000, "accepted %d of 20000 mutants", accepted);
}
