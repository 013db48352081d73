/* runtime/train/signals.c — see signals.h. */
#include "train/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>

static volatile sig_atomic_t pending;
static struct sigaction old_int, old_term;
static bool installed;

static void on_signal(int sig) { pending = sig; }

HpcStatus signals_install(HpcError *err)
{
    if (installed) return hpc_fail(err, HPC_ERR_USAGE, "signals_install: already installed");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;   /* a second signal takes the default action */
    if (sigaction(SIGINT, &sa, &old_int) != 0)
        return hpc_fail(err, HPC_ERR_INTERNAL, "sigaction(SIGINT): %s", strerror(errno));
    if (sigaction(SIGTERM, &sa, &old_term) != 0) {
        int e = errno;
        sigaction(SIGINT, &old_int, NULL);
        return hpc_fail(err, HPC_ERR_INTERNAL, "sigaction(SIGTERM): %s", strerror(e));
    }
    pending = 0;
    installed = true;
    return HPC_OK;
}

int signals_pending(void) { return pending; }

void signals_clear(void) { pending = 0; }

void signals_restore(void)
{
    if (!installed) return;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    installed = false;
}
