/* tools/cuemu/emu_tmap.h — what the emulator's cuTensorMapEncodeTiled
 * (emu_driver.c) writes into a CUtensorMap's 128 bytes and its TMA loads
 * (emu_kernel.h) read: C and C++ alike. */
#ifndef HPC_TOOLS_CUEMU_EMU_TMAP_H
#define HPC_TOOLS_CUEMU_EMU_TMAP_H

#include <stdint.h>

#define EMU_TMAP_MAGIC 0x544d4150u   /* "TMAP" */

typedef struct {
    uint32_t magic;
    uint32_t element_bytes;   /* 2 (f16, bf16) or 4 (f32) */
    uint32_t swizzle_bytes;   /* 0 (none) or 128 */
    uint32_t box[2];          /* elements: inner, outer */
    uint64_t address;         /* global */
    uint64_t dim[2];          /* elements: inner, outer */
    uint64_t outer_stride;    /* bytes between outer rows */
} EmuTensorMap;

#endif
