/* tests/test_fuzz_regress.c — every input the fuzzers ever failed on, replayed.
 *
 * `make fuzz` (tests/fuzz/run.sh) saves an input that crashed, leaked or
 * hung a harness as build/fuzz/crash/NAME-*; once fixed, the file moves to
 * tests/data/fuzz-regress/NAME/ and this test feeds it, on every `make
 * test`, through the same target the harness runs (tests/fuzz/targets.c),
 * built with the normal compiler.  The seeds of each harness
 * (tests/fuzz/seeds/NAME/) are replayed as well, so each target is known to
 * accept real files.  A crash shows as a crashed test; a target that
 * breaks a reader's promise traps. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/targets.c"

static const char *root(void)
{
    const char *r = getenv("HPC_ROOT");
    return r && r[0] ? r : ".";
}

/* Feeds every file of DIR to target; returns how many. */
static int replay_dir(const FuzzTarget *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert(f, "open %s", path);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        rewind(f);
        uint8_t *buf = malloc((size_t)len + 1);
        cr_assert(buf && fread(buf, 1, (size_t)len, f) == (size_t)len, "read %s", path);
        fclose(f);
        cr_log_info("%s: %s (%ld bytes)", t->name, path, len);
        cr_expect_eq(t->run(buf, (size_t)len), 0, "%s", path);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

static void replay(const char *name)
{
    const FuzzTarget *t = fuzz_targets;
    while (t->name && strcmp(t->name, name) != 0) t++;
    cr_assert(t->name, "no fuzz target %s", name);
    char seeds[1024], regress[1024];
    snprintf(seeds, sizeof seeds, "%s/tests/fuzz/seeds/%s", root(), name);
    snprintf(regress, sizeof regress, "%s/tests/data/fuzz-regress/%s", root(), name);
    int n_seeds = replay_dir(t, seeds);
    replay_dir(t, regress);
    cr_expect(n_seeds > 0, "no seeds in %s", seeds);
}

Test(fuzz_regress, safetensors) { replay("safetensors"); }
Test(fuzz_regress, artifact, .timeout = 60) { replay("artifact"); }
Test(fuzz_regress, checkpoint_state, .timeout = 60) { replay("checkpoint_state"); }
Test(fuzz_regress, runlog) { replay("runlog"); }
Test(fuzz_regress, tsv) { replay("tsv"); }
Test(fuzz_regress, vocab) { replay("vocab"); }

/* Every harness file has a test above. */
Test(fuzz_regress, every_target_is_replayed)
{
    int n = 0;
    for (const FuzzTarget *t = fuzz_targets; t->name; t++) n++;
    cr_expect_eq(n, 6, "a new fuzz target needs its Test() here");
}
