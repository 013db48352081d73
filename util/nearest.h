/* util/nearest.h — "did you mean": the known name closest to a misspelt one.
 *
 * Distance is the edit distance with adjacent swaps ("tahn" -> "tanh" is 1);
 * a name counts as close when the distance is at most 1 for words of up to
 * 4 characters, 2 up to 8, 3 beyond.  Used by the model checker for keys and
 * values, and by the command line for options and choices. */
#ifndef HPC_UTIL_NEAREST_H
#define HPC_UTIL_NEAREST_H

/* The closest of names[0..n) to word, or NULL when none is close. */
const char *nearest_name(const char *word, const char *const *names, int n);

#endif
