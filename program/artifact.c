/* program/artifact.c — NAME.hpc: write, read, and the resolved model
 * text; see artifact.h. */
#include "program/artifact.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "num_parse.h"

/* ---- the resolved model text --------------------------------------------- */

char *artifact_model_text(const ModelSpec *spec)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) hpc_panic(__FILE__, __LINE__, "out of host memory for the model text");
    fprintf(f, "# resolved by hpc compile from %s\n", spec->source[0] ? spec->source : "(memory)");
    spec_write(spec, f);
    fclose(f);
    return text;
}

void artifact_path_for(const char *model_name, char *buf, size_t size)
{
    size_t n = 0;
    for (const char *p = model_name; *p && n + sizeof ARTIFACT_EXT < size; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
        buf[n++] = ok ? c : '_';
    }
    snprintf(buf + n, size - n, "%s", ARTIFACT_EXT);
}

/* ---- the container --------------------------------------------------------- */

static void put_section(FILE *f, const char *kind, const char *text)
{
    if (!text) return;
    fprintf(f, "@@ %s %zu\n", kind, strlen(text));
    fwrite(text, 1, strlen(text), f);
    fputc('\n', f);
}

HpcStatus artifact_write(const char *path, const Artifact *a, HpcError *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return hpc_fail(err, HPC_ERR_IO, "artifact: open %s for writing: %s; check the directory is writable",
                        tmp, strerror(errno));
    fprintf(f, "%s %d\nname %s\npolicy %s\n", ARTIFACT_MAGIC, ARTIFACT_VERSION, a->name, spec_precision_name(a->policy));
    put_section(f, "model", a->model_text);
    put_section(f, "plan", a->plan_text);
    put_section(f, "cuda", a->cuda_source);
    put_section(f, "program", a->program_text);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return hpc_fail(err, HPC_ERR_IO, "artifact: write %s: %s; check the disk space", path, strerror(e));
    }
    return HPC_OK;
}

static char *read_all(const char *path, size_t *len, HpcError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        hpc_fail(err, HPC_ERR_IO, "artifact: open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = NULL, chunk[65536];
    size_t size = 0, n;
    FILE *mem = open_memstream(&text, &size);
    if (!mem) hpc_panic(__FILE__, __LINE__, "out of host memory reading %s", path);
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, n, mem);
    fclose(f);
    fclose(mem);
    *len = size;
    return text;
}

static HpcStatus bad_file(HpcError *err, const char *path, size_t off, const char *why)
{
    return hpc_fail(err, HPC_ERR_INPUT, "artifact: %s at byte %zu: %s; recompile it with `hpc compile MODEL`",
                    path, off, why);
}

/* "HPCART VERSION\n" at s: the version (util/num_parse.h, strictly) and the line's length. */
static bool magic_line(const char *s, size_t len, int64_t *version, size_t *used)
{
    size_t m = strlen(ARTIFACT_MAGIC " ");
    const char *nl = memchr(s, '\n', len);
    if (!nl || (size_t)(nl - s) <= m || strncmp(s, ARTIFACT_MAGIC " ", m) != 0) return false;
    *used = (size_t)(nl - s) + 1;
    return num_int_n(s + m, (size_t)(nl - s) - m, 1, INT64_MAX, version) == NUM_OK;
}

/* The header lines: magic + version, name, policy. */
static HpcStatus parse_header(const char *path, const char *s, size_t len, size_t *pos, Artifact *a, HpcError *err)
{
    int64_t version = 0;
    size_t used = 0;
    if (!magic_line(s, len, &version, &used))
        return bad_file(err, path, 0, "not an hpc artifact (no " ARTIFACT_MAGIC " header with a format version "
                        "in [1, 9223372036854775807])");
    if (version != ARTIFACT_VERSION) {
        char why[128];
        snprintf(why, sizeof why, "format version %lld, this hpc reads version %d", (long long)version,
                 ARTIFACT_VERSION);
        return bad_file(err, path, 0, why);
    }
    char name[128] = "", pol[16] = "";
    int n2 = 0;
    if (sscanf(s + used, "name %127s\npolicy %15s\n%n", name, pol, &n2) < 2 || n2 == 0)
        return bad_file(err, path, used, "the name and policy lines are missing");
    snprintf(a->name, sizeof a->name, "%s", name);
    bool known = false;
    for (SpecPrecision p = PREC_DEFAULT; p <= PREC_BF16; p++)
        if (strcmp(pol, spec_precision_name(p)) == 0) a->policy = p, known = true;
    char why[80];
    snprintf(why, sizeof why, "unknown precision policy '%s' (expected default, fp32, fp16 or bf16)", pol);
    if (!known) return bad_file(err, path, used, why);
    *pos = used + (size_t)n2;
    return *pos <= len ? HPC_OK : bad_file(err, path, len, "truncated header");
}

/* "@@ KIND BYTES\n" at s: the kind, the byte count (strictly) and the line's length. */
static bool section_line(const char *s, size_t avail, char kind[16], uint64_t *bytes, size_t *used)
{
    const char *nl = memchr(s, '\n', avail);
    if (!nl || nl - s < 3 || strncmp(s, "@@ ", 3) != 0) return false;
    const char *k = s + 3, *sp = memchr(k, ' ', (size_t)(nl - k));
    if (!sp || sp == k || sp - k > 15) return false;
    memcpy(kind, k, (size_t)(sp - k));
    kind[sp - k] = '\0';
    *used = (size_t)(nl - s) + 1;
    return num_uint_n(sp + 1, (size_t)(nl - sp - 1), SIZE_MAX, bytes) == NUM_OK;
}

static HpcStatus parse_sections(const char *path, const char *s, size_t len, size_t pos, Artifact *a, HpcError *err)
{
    while (pos < len) {
        char kind[16];
        uint64_t bytes = 0;
        size_t used = 0;
        if (!section_line(s + pos, len - pos, kind, &bytes, &used))
            return bad_file(err, path, pos, "expected a section line '@@ KIND BYTES'");
        pos += used;
        if (bytes > len - pos) return bad_file(err, path, pos, "truncated section");
        char *text = xmalloc(bytes + 1);
        memcpy(text, s + pos, bytes);
        text[bytes] = '\0';
        char **slot = strcmp(kind, "model") == 0 ? &a->model_text : strcmp(kind, "plan") == 0 ? &a->plan_text
                    : strcmp(kind, "cuda") == 0 ? &a->cuda_source
                    : strcmp(kind, "program") == 0 ? &a->program_text : NULL;
        if (!slot || *slot) {
            free(text);
            char why[96];
            snprintf(why, sizeof why, "%s section '%s'", slot ? "a second" : "unknown", kind);
            return bad_file(err, path, pos, why);
        }
        *slot = text;
        pos += bytes + (pos + bytes < len && s[pos + bytes] == '\n');
    }
    return a->model_text ? HPC_OK : bad_file(err, path, len, "no model section");
}

HpcStatus artifact_read(const char *path, Artifact *a, HpcError *err)
{
    memset(a, 0, sizeof *a);
    size_t len = 0, pos = 0;
    char *s = read_all(path, &len, err);
    if (!s) return err->code;
    HpcStatus st = parse_header(path, s, len, &pos, a, err);
    if (!st) st = parse_sections(path, s, len, pos, a, err);
    free(s);
    if (st) artifact_free(a);
    return st;
}

void artifact_free(Artifact *a)
{
    free(a->model_text);
    free(a->plan_text);
    free(a->cuda_source);
    free(a->program_text);
    memset(a, 0, sizeof *a);
}
