/* runtime/dist/rendezvous.c — rank discovery from the environment and the
 * rank-0-to-all hand-over of the communicator id, over a file or TCP. */
#include "dist/rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DIST_MAX_WORLD 4096

/* A whole decimal integer in [lo, hi], or an error naming the variable. */
static HpcStatus env_int(const char *name, const char *text, long lo, long hi, int *out, HpcError *err)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi)
        return hpc_fail(err, HPC_ERR_USAGE, "%s=%s: expected a whole number from %ld to %ld", name, text, lo, hi);
    *out = (int)v;
    return HPC_OK;
}

static HpcStatus parse_tcp(DistEnv *env, const char *what, const char *hostport, HpcError *err)
{
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof env->host)
        return hpc_fail(err, HPC_ERR_USAGE, "%s: expected HOST:PORT, got \"%s\"", what, hostport);
    memcpy(env->host, hostport, (size_t)(colon - hostport));
    env->host[colon - hostport] = 0;
    env->kind = RDV_TCP;
    return env_int(what, colon + 1, 1, 65535, &env->port, err);
}

HpcStatus dist_env_read(DistEnv *env, const char *(*getenv_fn)(const char *name), HpcError *err)
{
    *env = (DistEnv){ .rank = 0, .world = 1, .local_rank = 0, .kind = RDV_NONE, .timeout_s = 300 };
    const char *rank = getenv_fn("RANK"), *world = getenv_fn("WORLD_SIZE");
    if (!rank && !world) return HPC_OK;
    if (!rank || !world)
        return hpc_fail(err, HPC_ERR_USAGE, "%s is set but %s is not: a data-parallel run needs both RANK "
                        "and WORLD_SIZE", rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK");
    HpcStatus st = env_int("WORLD_SIZE", world, 1, DIST_MAX_WORLD, &env->world, err);
    if (!st) st = env_int("RANK", rank, 0, env->world - 1, &env->rank, err);
    if (st) return st;
    env->local_rank = env->rank;
    const char *local = getenv_fn("LOCAL_RANK");
    if (local && (st = env_int("LOCAL_RANK", local, 0, DIST_MAX_WORLD - 1, &env->local_rank, err))) return st;
    const char *timeout = getenv_fn("HPC_COLLECTIVE_TIMEOUT");
    if (timeout) {
        int t;
        if ((st = env_int("HPC_COLLECTIVE_TIMEOUT", timeout, 1, 86400, &t, err))) return st;
        env->timeout_s = t;
    }
    const char *rdv = getenv_fn("HPC_RENDEZVOUS");
    if (rdv && strncmp(rdv, "file:", 5) == 0) {
        if (!rdv[5] || strlen(rdv + 5) >= sizeof env->path)
            return hpc_fail(err, HPC_ERR_USAGE, "HPC_RENDEZVOUS=%s: the file path is empty or too long", rdv);
        snprintf(env->path, sizeof env->path, "%s", rdv + 5);
        env->kind = RDV_FILE;
        return HPC_OK;
    }
    if (rdv && strncmp(rdv, "tcp:", 4) == 0) return parse_tcp(env, "HPC_RENDEZVOUS", rdv + 4, err);
    if (rdv)
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_RENDEZVOUS=%s: expected file:PATH or tcp:HOST:PORT", rdv);
    const char *addr = getenv_fn("MASTER_ADDR"), *port = getenv_fn("MASTER_PORT");
    if (addr && port) {
        char hp[300];
        snprintf(hp, sizeof hp, "%s:%s", addr, port);
        return parse_tcp(env, "MASTER_ADDR/MASTER_PORT", hp, err);
    }
    if (env->world == 1) return HPC_OK;
    return hpc_fail(err, HPC_ERR_USAGE, "WORLD_SIZE=%d but no rendezvous: set HPC_RENDEZVOUS=file:PATH "
                    "(a file all ranks can see) or tcp:HOST:PORT, or MASTER_ADDR and MASTER_PORT", env->world);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

static void nap_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

/* ---- file ---- */
static HpcStatus publish_file(const DistEnv *env, const void *blob, size_t n, HpcError *err)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", env->path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return hpc_fail(err, HPC_ERR_IO, "rendezvous file %s: %s", tmp, strerror(errno));
    bool ok = fwrite(blob, 1, n, f) == n;
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, env->path) != 0) {
        int e = errno;
        unlink(tmp);
        return hpc_fail(err, HPC_ERR_IO, "rendezvous file %s: %s", env->path, strerror(e));
    }
    return HPC_OK;
}

static HpcStatus await_file(const DistEnv *env, void *blob, size_t n, HpcError *err)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        FILE *f = fopen(env->path, "rb");
        if (f) {
            size_t got = fread(blob, 1, n, f);
            int extra = fgetc(f);
            fclose(f);
            if (got == n && extra == EOF) return HPC_OK;
            return hpc_fail(err, HPC_ERR_INPUT, "rendezvous file %s holds %s than the %zu bytes rank 0 "
                            "writes: another run's file? remove it and start again", env->path,
                            got < n ? "fewer" : "more", n);
        }
        if (seconds_since(&t0) > env->timeout_s)
            return hpc_fail(err, HPC_ERR_IO, "rank %d waited %g s for rank 0 to write %s; is rank 0 running, "
                            "and on a file system this host sees?", env->rank, env->timeout_s, env->path);
        nap_ms(20);
    }
}

/* ---- tcp ---- */
static int tcp_socket(const DistEnv *env, bool listening, HpcError *err, HpcStatus *st)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = listening ? AI_PASSIVE : 0 }, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", env->port);
    int rc = getaddrinfo(listening ? NULL : env->host, port, &hints, &ai);
    if (rc) {
        *st = hpc_fail(err, HPC_ERR_USAGE, "rendezvous address %s:%d: %s", env->host, env->port, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        if (listening) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if ((listening ? bind(fd, p->ai_addr, p->ai_addrlen) == 0 && listen(fd, 64) == 0
                       : connect(fd, p->ai_addr, p->ai_addrlen) == 0)) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) *st = hpc_fail(err, HPC_ERR_IO, "rendezvous %s %s:%d: %s", listening ? "listen on" : "connect to",
                               env->host, env->port, strerror(errno));
    return fd;
}

static HpcStatus publish_tcp(const DistEnv *env, const void *blob, size_t n, HpcError *err)
{
    HpcStatus st = HPC_OK;
    int lfd = tcp_socket(env, true, err, &st);
    if (lfd < 0) return st;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int served = 1; served < env->world && !st;) {
        double left = env->timeout_s - seconds_since(&t0);
        struct pollfd pfd = { .fd = lfd, .events = POLLIN };
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000)) <= 0) {
            st = hpc_fail(err, HPC_ERR_IO, "rank 0 waited %g s on port %d; %d of %d ranks arrived",
                          env->timeout_s, env->port, served - 1, env->world - 1);
            break;
        }
        int cfd = accept(lfd, NULL, NULL);
        if (cfd < 0) continue;
        if (write(cfd, blob, n) == (ssize_t)n) served++;
        close(cfd);
    }
    close(lfd);
    return st;
}

static HpcStatus await_tcp(const DistEnv *env, void *blob, size_t n, HpcError *err)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        HpcStatus st = HPC_OK;
        HpcError quiet;
        int fd = tcp_socket(env, false, &quiet, &st);
        if (fd >= 0) {
            size_t got = 0;
            while (got < n) {
                ssize_t r = read(fd, (char *)blob + got, n - got);
                if (r <= 0) break;
                got += (size_t)r;
            }
            close(fd);
            if (got == n) return HPC_OK;
        } else if (st == HPC_ERR_USAGE) {
            return hpc_fail(err, st, "%s", quiet.msg);
        }
        if (seconds_since(&t0) > env->timeout_s)
            return hpc_fail(err, HPC_ERR_IO, "rank %d could not reach rank 0 at %s:%d within %g s; is rank 0 "
                            "running there?", env->rank, env->host, env->port, env->timeout_s);
        nap_ms(50);
    }
}

HpcStatus dist_exchange(const DistEnv *env, void *blob, size_t n, HpcError *err)
{
    if (env->world == 1) return HPC_OK;
    switch (env->kind) {
    case RDV_FILE: return env->rank == 0 ? publish_file(env, blob, n, err) : await_file(env, blob, n, err);
    case RDV_TCP:  return env->rank == 0 ? publish_tcp(env, blob, n, err) : await_tcp(env, blob, n, err);
    case RDV_NONE: break;
    }
    return hpc_fail(err, HPC_ERR_USAGE, "a world of %d ranks needs a rendezvous (HPC_RENDEZVOUS)", env->world);
}
