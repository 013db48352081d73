/* compiler/kernel_sources.c — lookup in the generated table. */
#include "kernel_sources.h"

#include <string.h>

const char *kernel_source_find(const char *name)
{
    for (int i = 0; i < kernel_source_count; i++)
        if (strcmp(kernel_sources[i].name, name) == 0) return kernel_sources[i].text;
    return 0;
}
