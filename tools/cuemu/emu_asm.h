/* tools/cuemu/emu_asm.h — inline PTX rewritten into calls of emu_kernel.h
 * (see emu_asm.c for the rules). */
#ifndef HPC_TOOLS_CUEMU_EMU_ASM_H
#define HPC_TOOLS_CUEMU_EMU_ASM_H

/* The preprocessed source with every asm statement replaced, and every
 * dynamic shared-memory declaration (malloc'd; never NULL). */
char *emu_rewrite_asm(const char *src);

#endif
