/* runtime/formats/safetensors.c — see safetensors.h.
 *
 * The reader trusts nothing until validate_layout() has passed: every size
 * comes from the file, so each product is overflow-checked and each offset
 * compared with the real data length before any pointer is formed.
 */
#include "formats/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "formats/atomic_file.h"
#include "formats/tensor_finite.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; a big-endian host needs byte swapping");

/* Tensor names in messages are cut to this many bytes: a hostile file may
 * carry megabyte-long names. */
#define NAME_FMT "'%.200s'"

static const struct { const char *name; size_t size; } dtype_table[] = {
#define ST_ROW(e, name, size) {name, size},
    ST_DTYPE_LIST(ST_ROW)
#undef ST_ROW
};
_Static_assert(sizeof dtype_table / sizeof dtype_table[0] == ST_DTYPE_COUNT, "dtype table");

const char *st_dtype_name(StDtype d)
{
    HPC_ASSERT(d >= 0 && d < ST_DTYPE_COUNT);
    return dtype_table[d].name;
}

size_t st_dtype_size(StDtype d)
{
    HPC_ASSERT(d >= 0 && d < ST_DTYPE_COUNT);
    return dtype_table[d].size;
}

bool st_dtype_parse(const char *name, StDtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (StDtype)i;
            return true;
        }
    return false;
}

struct StFile {
    char *name;            /* for messages */
    void *map;             /* the mapping when opened from a path, else NULL */
    size_t map_len;
    json_t *root;          /* owns the names and metadata strings */
    StTensor *tensors;     /* count, sorted by data offset */
    int64_t count;
    int64_t *by_name;      /* indices into tensors, sorted by name */
    const char **meta;     /* 2 * meta_count: key, value, ... */
    int64_t meta_count;
};

/* ------------------------------------------------------------------ */
/* Reading                                                              */

/* True if buf[0..len) is well-formed UTF-8 (no overlongs, no surrogates). */
static bool valid_utf8(const uint8_t *buf, size_t len, size_t *bad_at)
{
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(buf + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0) {
            *bad_at = i;
            return false;
        }
        i += (size_t)n;
    }
    return true;
}

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* Reads one JSON array of non-negative integers into out[0..*n). */
static HpcStatus read_uint_array(const StFile *f, const char *tname, const char *field,
                                 json_t *arr, int64_t *out, int max, int *n, HpcError *err)
{
    if (!json_is_array(arr))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"%s\" must be an array of integers",
                        f->name, tname, field);
    size_t len = json_array_size(arr);
    if (len > (size_t)max)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"%s\" has %zu entries, at most %d allowed",
                        f->name, tname, field, len, max);
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"%s\"[%zu] is not an integer",
                            f->name, tname, field, i);
        json_int_t x = json_integer_value(v);
        if (x < 0)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"%s\"[%zu] = %lld is negative",
                            f->name, tname, field, i, (long long)x);
        out[i] = (int64_t)x;
    }
    *n = (int)len;
    return HPC_OK;
}

static HpcStatus parse_metadata(StFile *f, json_t *obj, HpcError *err)
{
    if (!json_is_object(obj))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: \"__metadata__\" must be an object of strings", f->name);
    f->meta = xcalloc(2 * json_object_size(obj) + 1, sizeof *f->meta);
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!json_is_string(v))
            return hpc_fail(err, HPC_ERR_INPUT, "%s: \"__metadata__\" entry " NAME_FMT " is not a string",
                            f->name, key);
        f->meta[2 * f->meta_count] = key;
        f->meta[2 * f->meta_count + 1] = json_string_value(v);
        f->meta_count++;
    }
    return HPC_OK;
}

/* Fills t from one header entry; sizes checked, offsets not yet. */
static HpcStatus parse_tensor(StFile *f, const char *name, json_t *info, StTensor *t,
                              uint64_t offsets[2], HpcError *err)
{
    if (!json_is_object(info))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": entry must be an object with "
                        "dtype, shape and data_offsets", f->name, name);
    json_t *dt = json_object_get(info, "dtype");
    if (!json_is_string(dt))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"dtype\" missing or not a string",
                        f->name, name);
    if (!st_dtype_parse(json_string_value(dt), &t->dtype))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": unknown dtype \"%.40s\" "
                        "(known: BOOL U8 I8 F8_E4M3 F8_E5M2 U16 I16 F16 BF16 U32 I32 F32 U64 I64 F64)",
                        f->name, name, json_string_value(dt));
    t->name = name;
    HpcStatus st = read_uint_array(f, name, "shape", json_object_get(info, "shape"), t->shape,
                                   ST_MAX_DIMS, &t->ndim, err);
    if (st) return st;
    int64_t off[2];
    int n_off;
    st = read_uint_array(f, name, "data_offsets", json_object_get(info, "data_offsets"), off, 2, &n_off, err);
    if (st) return st;
    if (n_off != 2)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": \"data_offsets\" must be [begin, end]",
                        f->name, name);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        if (mul_overflows(numel, (uint64_t)t->shape[i], &numel))
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": shape's element count overflows "
                            "64 bits", f->name, name);
    if (mul_overflows(numel, st_dtype_size(t->dtype), &t->nbytes))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": byte size (%llu elements of %s) "
                        "overflows 64 bits", f->name, name, (unsigned long long)numel, st_dtype_name(t->dtype));
    t->numel = numel;
    offsets[0] = (uint64_t)off[0];
    offsets[1] = (uint64_t)off[1];
    if (offsets[1] < offsets[0])
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] end before "
                        "they begin", f->name, name, (unsigned long long)offsets[0], (unsigned long long)offsets[1]);
    if (offsets[1] - offsets[0] != t->nbytes)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] span %llu bytes "
                        "but %s shape needs %llu", f->name, name, (unsigned long long)offsets[0],
                        (unsigned long long)offsets[1], (unsigned long long)(offsets[1] - offsets[0]),
                        st_dtype_name(t->dtype), (unsigned long long)t->nbytes);
    return HPC_OK;
}

typedef struct { uint64_t begin, end; int64_t idx; } Span;

static int cmp_span(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The tensors must tile [0, data_len) exactly, in some order. */
static HpcStatus validate_layout(StFile *f, Span *spans, const uint8_t *data, uint64_t data_len,
                                 HpcError *err)
{
    qsort(spans, (size_t)f->count, sizeof *spans, cmp_span);
    uint64_t expect = 0;
    const char *prev = NULL;
    for (int64_t i = 0; i < f->count; i++) {
        const char *name = f->tensors[spans[i].idx].name;
        if (spans[i].end > data_len)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] run past "
                            "the end of the data section (%llu bytes): the file is truncated or corrupt",
                            f->name, name, (unsigned long long)spans[i].begin,
                            (unsigned long long)spans[i].end, (unsigned long long)data_len);
        if (spans[i].begin < expect)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] overlap "
                            "tensor " NAME_FMT, f->name, name, (unsigned long long)spans[i].begin,
                            (unsigned long long)spans[i].end, prev);
        if (spans[i].begin > expect)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: tensor " NAME_FMT ": data_offsets begin at %llu, leaving "
                            "a gap of %llu unclaimed bytes before it", f->name, name,
                            (unsigned long long)spans[i].begin, (unsigned long long)(spans[i].begin - expect));
        expect = spans[i].end;
        prev = name;
    }
    if (expect != data_len)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: the data section has %llu bytes but the tensors cover only "
                        "%llu: %llu trailing bytes not covered by any tensor", f->name,
                        (unsigned long long)data_len, (unsigned long long)expect,
                        (unsigned long long)(data_len - expect));
    /* Checks passed: now pointers may be formed, in offset order. */
    StTensor *sorted = xcalloc((size_t)f->count + 1, sizeof *sorted);
    for (int64_t i = 0; i < f->count; i++) {
        sorted[i] = f->tensors[spans[i].idx];
        sorted[i].data = data + spans[i].begin;
    }
    free(f->tensors);
    f->tensors = sorted;
    return HPC_OK;
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const StTensor *t = ctx;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

static void index_names(StFile *f)
{
    f->by_name = xcalloc((size_t)f->count + 1, sizeof *f->by_name);
    for (int64_t i = 0; i < f->count; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->count, sizeof *f->by_name, cmp_by_name, f->tensors);
}

static HpcStatus parse_header_json(StFile *f, const uint8_t *hdr, uint64_t n, HpcError *err)
{
    size_t bad;
    if (!valid_utf8(hdr, (size_t)n, &bad))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: header is not valid UTF-8 (byte %zu of %llu); "
                        "this is not a safetensors file or it is corrupt", f->name, bad, (unsigned long long)n);
    json_error_t jerr;
    f->root = json_loadb((const char *)hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: header is not valid JSON: %s (header byte %d); "
                        "this is not a safetensors file or it is corrupt", f->name, jerr.text, jerr.position);
    if (!json_is_object(f->root))
        return hpc_fail(err, HPC_ERR_INPUT, "%s: header must be a JSON object of tensors, found an array",
                        f->name);
    return HPC_OK;
}

static HpcStatus parse_file(StFile *f, const uint8_t *buf, size_t len, HpcError *err)
{
    if (len < 8)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: %zu bytes is too short for a safetensors file "
                        "(it starts with an 8-byte header length)", f->name, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > ST_MAX_HEADER)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: header length %llu exceeds the %llu-byte limit; "
                        "this is not a safetensors file or it is corrupt", f->name,
                        (unsigned long long)n, (unsigned long long)ST_MAX_HEADER);
    if (n > len - 8)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: header length %llu runs past the end of the file "
                        "(%zu bytes): truncated or not a safetensors file", f->name, (unsigned long long)n, len);
    HpcStatus st = parse_header_json(f, buf + 8, n, err);
    if (st) return st;
    size_t entries = json_object_size(f->root);
    f->tensors = xcalloc(entries + 1, sizeof *f->tensors);
    Span *spans = xcalloc(entries + 1, sizeof *spans);
    const char *key;
    json_t *v;
    json_object_foreach(f->root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, v, err);
        } else {
            uint64_t off[2] = {0, 0};
            st = parse_tensor(f, key, v, &f->tensors[f->count], off, err);
            spans[f->count] = (Span){off[0], off[1], f->count};
            f->count++;
        }
        if (st) break;
    }
    if (!st) st = validate_layout(f, spans, buf + 8 + n, len - 8 - n, err);
    free(spans);
    if (!st) index_names(f);
    return st;
}

static StFile *file_new(const char *name)
{
    StFile *f = xcalloc(1, sizeof *f);
    f->name = xstrdup(name);
    return f;
}

HpcStatus st_open_memory(const void *buf, size_t len, const char *name, StFile **out, HpcError *err)
{
    *out = NULL;
    StFile *f = file_new(name);
    HpcStatus st = parse_file(f, buf, len, err);
    if (st) {
        st_close(f);
        return st;
    }
    *out = f;
    return HPC_OK;
}

HpcStatus st_open(const char *path, StFile **out, HpcError *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return hpc_fail(err, errno == ENOENT ? HPC_ERR_INPUT : HPC_ERR_IO, "open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hpc_fail(err, HPC_ERR_IO, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return hpc_fail(err, HPC_ERR_INPUT, "open %s: not a regular file (a directory?); give the "
                        ".safetensors file itself", path);
    }
    StFile *f = file_new(path);
    size_t len = (size_t)sb.st_size;
    if (len >= 8) {
        f->map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            f->map = NULL;
            close(fd);
            st_close(f);
            return hpc_fail(err, HPC_ERR_IO, "mmap %s (%zu bytes): %s", path, len, strerror(e));
        }
        f->map_len = len;
    }
    close(fd);   /* the mapping keeps the file alive */
    static const uint8_t empty[1];
    HpcStatus st = parse_file(f, f->map ? f->map : empty, len, err);
    if (st) {
        st_close(f);
        return st;
    }
    *out = f;
    return HPC_OK;
}

void st_close(StFile *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    if (f->root) json_decref(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->name);
    free(f);
}

int64_t st_count(const StFile *f) { return f->count; }

const StTensor *st_tensor(const StFile *f, int64_t i)
{
    HPC_ASSERT(i >= 0 && i < f->count);
    return &f->tensors[i];
}

const StTensor *st_find(const StFile *f, const char *name)
{
    int64_t lo = 0, hi = f->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->by_name[mid]].name, name);
        if (c == 0) return &f->tensors[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int64_t st_tensor_index(const StFile *f, const StTensor *t)
{
    HPC_ASSERT(t >= f->tensors && t < f->tensors + f->count);
    return t - f->tensors;
}

int64_t st_metadata_count(const StFile *f) { return f->meta_count; }

void st_metadata_at(const StFile *f, int64_t i, const char **key, const char **value)
{
    HPC_ASSERT(i >= 0 && i < f->meta_count);
    *key = f->meta[2 * i];
    *value = f->meta[2 * i + 1];
}

const char *st_metadata_get(const StFile *f, const char *key)
{
    for (int64_t i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

HpcStatus st_tensor_check_finite(const StFile *f, const StTensor *t, HpcError *err)
{
    return tensor_check_finite(f->name, t->name, t->dtype, t->data, t->numel, err);
}

HpcStatus st_tensor_copy(const StTensor *t, void *dst, size_t cap, HpcError *err)
{
    if (t->nbytes > cap)
        return hpc_fail(err, HPC_ERR_USAGE, "copy tensor " NAME_FMT ": %llu bytes do not fit in a %zu-byte "
                        "buffer", t->name, (unsigned long long)t->nbytes, cap);
    if (t->nbytes) memcpy(dst, t->data, (size_t)t->nbytes);
    return HPC_OK;
}

/* ------------------------------------------------------------------ */
/* Writing                                                              */

void st_writer_init(StWriter *w)
{
    memset(w, 0, sizeof *w);
}

static HpcStatus check_name(const StWriter *w, const char *name, HpcError *err)
{
    size_t bad;
    if (!name || !*name)
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add: empty tensor name");
    if (!valid_utf8((const uint8_t *)name, strlen(name), &bad))
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add: tensor name " NAME_FMT " is not valid UTF-8", name);
    if (strcmp(name, "__metadata__") == 0)
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add: \"__metadata__\" is reserved, not a tensor name");
    for (int64_t i = 0; i < w->count; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add: tensor " NAME_FMT " added twice", name);
    return HPC_OK;
}

HpcStatus st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim,
                        const int64_t *shape, const void *data, HpcError *err)
{
    HpcStatus st = check_name(w, name, err);
    if (st) return st;
    if (dtype < 0 || dtype >= ST_DTYPE_COUNT || ndim < 0 || ndim > ST_MAX_DIMS)
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add " NAME_FMT ": bad dtype %d or ndim %d (0..%d)",
                        name, (int)dtype, ndim, ST_MAX_DIMS);
    StTensor t = {.dtype = dtype, .ndim = ndim, .data = data};
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || mul_overflows(numel, (uint64_t)shape[i], &numel))
            return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add " NAME_FMT ": dim %d = %lld is negative or "
                            "the size overflows", name, i, (long long)shape[i]);
        t.shape[i] = shape[i];
    }
    if (mul_overflows(numel, st_dtype_size(dtype), &t.nbytes) || t.nbytes > (uint64_t)INT64_MAX)
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add " NAME_FMT ": byte size overflows", name);
    if (t.nbytes > 0 && !data)
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_add " NAME_FMT ": NULL data for %llu bytes", name,
                        (unsigned long long)t.nbytes);
    t.numel = numel;
    t.name = xstrdup(name);
    if (w->count == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->tensors = xrealloc(w->tensors, (size_t)w->cap * sizeof *w->tensors);
    }
    w->tensors[w->count++] = t;
    return HPC_OK;
}

HpcStatus st_writer_meta(StWriter *w, const char *key, const char *value, HpcError *err)
{
    size_t bad;
    if (!valid_utf8((const uint8_t *)key, strlen(key), &bad) ||
        !valid_utf8((const uint8_t *)value, strlen(value), &bad))
        return hpc_fail(err, HPC_ERR_USAGE, "st_writer_meta: key " NAME_FMT " or its value is not valid UTF-8", key);
    for (int64_t i = 0; i < w->meta_count; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = xstrdup(value);
            return HPC_OK;
        }
    w->meta = xrealloc(w->meta, (size_t)(w->meta_count + 1) * 2 * sizeof *w->meta);
    w->meta[2 * w->meta_count] = xstrdup(key);
    w->meta[2 * w->meta_count + 1] = xstrdup(value);
    w->meta_count++;
    return HPC_OK;
}

/* Largest element first keeps every tensor aligned to its element size,
 * given an 8-aligned data section; ties go by name for a stable file. */
static int cmp_layout(const void *a, const void *b, void *ctx)
{
    const StTensor *t = ctx;
    const StTensor *x = &t[*(const int64_t *)a], *y = &t[*(const int64_t *)b];
    size_t sx = st_dtype_size(x->dtype), sy = st_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Builds the header JSON; order[] receives the layout order. */
static char *build_header(const StWriter *w, int64_t *order)
{
    for (int64_t i = 0; i < w->count; i++) order[i] = i;
    qsort_r(order, (size_t)w->count, sizeof *order, cmp_layout, w->tensors);
    json_t *root = json_object();
    if (w->meta_count) {
        json_t *meta = json_object();
        for (int64_t i = 0; i < w->meta_count; i++)
            json_object_set_new(meta, w->meta[2 * i], json_string(w->meta[2 * i + 1]));
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int64_t k = 0; k < w->count; k++) {
        const StTensor *t = &w->tensors[order[k]];
        json_t *shape = json_array();
        for (int i = 0; i < t->ndim; i++) json_array_append_new(shape, json_integer(t->shape[i]));
        json_t *info = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t->dtype), "shape", shape,
                                 "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes));
        HPC_ASSERT(info);
        json_object_set_new(root, t->name, info);
        off += t->nbytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    HPC_ASSERT(text);
    return text;
}

static HpcStatus write_body(const StWriter *w, AtomicFile *af, const char *text, const int64_t *order,
                            HpcError *err)
{
    size_t len = strlen(text);
    size_t padded = (len + 7) & ~(size_t)7;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    HpcStatus st = atomic_write(af, prefix, 8, err);
    if (!st) st = atomic_write(af, text, len, err);
    if (!st) st = atomic_write(af, spaces, padded - len, err);
    for (int64_t k = 0; k < w->count && !st; k++) {
        const StTensor *t = &w->tensors[order[k]];
        st = atomic_write(af, t->data, (size_t)t->nbytes, err);
    }
    return st;
}

HpcStatus st_writer_save(const StWriter *w, const char *path, HpcError *err)
{
    int64_t *order = xcalloc((size_t)w->count + 1, sizeof *order);
    char *text = build_header(w, order);
    AtomicFile af;
    HpcStatus st = atomic_open(&af, path, err);
    if (!st) {
        st = write_body(w, &af, text, order, err);
        if (st) atomic_abort(&af);
        else st = atomic_commit(&af, err);
    }
    free(text);
    free(order);
    return st;
}

void st_writer_free(StWriter *w)
{
    for (int64_t i = 0; i < w->count; i++) free((char *)w->tensors[i].name);
    for (int64_t i = 0; i < 2 * w->meta_count; i++) free(w->meta[i]);
    free(w->tensors);
    free(w->meta);
    memset(w, 0, sizeof *w);
}
