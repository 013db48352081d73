/* cli/main.c — `hpc`: dispatch to a subcommand. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hpc.h"

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} Command;

static const Command commands[] = {
#define HPC_COMMAND(name, summary) {#name, summary, cmd_##name},
#include "commands.def"
#undef HPC_COMMAND
};

static void print_help(FILE *out)
{
    fputs("usage: hpc COMMAND [OPTIONS] [ARGS]\n"
          "\n"
          "hpc compiles a transformer described in a .model file into a\n"
          "mixed-precision training step and runs it.\n"
          "\n"
          "commands:\n", out);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fputs("\n"
          "`hpc COMMAND --help` (or `hpc help COMMAND`) describes a command's options;\n"
          "`hpc --version` prints the version.\n"
          "\n"
          "exit codes:\n"
          "  0  success\n"
          "  1  bad input (model file, data file, checkpoint)\n"
          "  2  usage error (bad command line)\n"
          "  3  file system error (unwritable or full disk, also of the --log file)\n"
          "  4  no usable GPU\n"
          "  5  CUDA, NVRTC or cuBLAS error\n"
          "  6  out of memory, or a run that would not fit (hpc run --no-memory-check)\n"
          "  7  training diverged (loss scale collapsed)\n"
          "  8  interrupted (state saved)\n"
          " 70  internal error (a bug in hpc)\n", out);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_help(stderr);
        return HPC_ERR_USAGE;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("hpc, C API %d.%d (include/hpc.h)\n", HPC_API_VERSION_MAJOR, HPC_API_VERSION_MINOR);
        return HPC_OK;
    }
    /* `hpc help COMMAND` is `hpc COMMAND --help` */
    bool help = strcmp(argv[1], "help") == 0;
    if (cli_is_help(argv[1]) || (help && (argc == 2 || cli_is_help(argv[2]) || strcmp(argv[2], "help") == 0))) {
        print_help(stdout);
        return HPC_OK;
    }
    const char *name = argv[help ? 2 : 1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) != 0) continue;
        if (help) return commands[i].run(2, (char *[]){argv[2], "--help", NULL});
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "hpc: unknown command '%s' (see `hpc --help`)\n", name);
    return HPC_ERR_USAGE;
}
