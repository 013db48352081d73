/* util/nearest.c — see nearest.h. */
#include "nearest.h"

#include <stddef.h>
#include <string.h>

/* Words are short (keys, options); longer ones are never "close". */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 99;
    int d[41][41];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

const char *nearest_name(const char *word, const char *const *names, int n)
{
    const char *best = NULL;
    int best_d = 99;
    size_t len = strlen(word);
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, names[i]);
        if (d < best_d) best_d = d, best = names[i];
    }
    return best_d <= limit ? best : NULL;
}
