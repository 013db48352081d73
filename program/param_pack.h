/* program/param_pack.h — where each parameter tensor lies in a packed
 * parameter buffer (the f32 masters, the 16-bit copies).
 *
 * The cuda executor keeps every family of parameter storage in one device
 * allocation (runtime/cuda/cuda_exec.c alloc_params); this module decides
 * the byte offset of each tensor in it.  Offsets follow the order of the
 * items the caller lists (parameter-table order for the masters, PARAM
 * node order for the 16-bit copies), each at a multiple of `align`, with
 * one exception: the three projections of a self-attention block,
 *   P.attention.self.{query,key,value}.weight   (H, H) each, and
 *   P.attention.self.{query,key,value}.bias     (H) each,
 * are placed back to back at the position of the first of them, so the
 * three weights read as one (3H, H) matrix (rows query, key, value) and
 * the three biases as one (3H) vector: what a single QKV GEMM needs
 * (issue 15 item 1, docs/fuse_qkv.md).  The group is formed only where
 * that adjacency is exact, that is every member has the same item tag (the
 * copy's dtype), owns storage (not tied) and its byte size is a multiple
 * of `align` (so no padding falls between members and every member keeps
 * the alignment it had; BERT-base, MiniLM, bert-tiny at H = 128 qualify).
 * Otherwise the members are packed one by one as any other tensor.
 *
 * Nothing else changes: the parameter table (names, order, shapes), the
 * checkpoint and Hugging Face formats, the initial values (drawn per
 * parameter into host arrays) are untouched; only the device offsets move.
 *
 * Usage:
 *   size_t *off = xcalloc(n, sizeof *off);
 *   size_t total = param_pack_offsets(&pl, n, item_param, item_tag, bytes, 256, off);
 *   // allocate total bytes; item i (bytes[i] > 0) lives at base + off[i]
 */
#ifndef HPC_PROGRAM_PARAM_PACK_H
#define HPC_PROGRAM_PARAM_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "program/params.h"

/* The alignment of every packed tensor (runtime/cuda's ARENA_ALIGN, which
 * cuda_exec.c checks equal): what cuBLASLt's default preferences assume. */
#define PARAM_PACK_ALIGN 256

/* Whether a group's members of numel elements each lie back to back in
 * every family (4-byte masters, 2-byte copies) at PARAM_PACK_ALIGN: the
 * condition param_pack_offsets groups under, for a rewrite that relies on
 * it (compiler/fuse_qkv.c). */
bool param_pack_adjacent_everywhere(int64_t numel);

/* If parameter q is one of a self-attention block's query/key/value
 * weights (or biases) and the other two are in the table with the same
 * shape, same frozen flag and none of them tied: fills members[0..2] with
 * the query, key and value indices and returns true. */
bool param_pack_qkv_group(const ParamList *pl, int q, int members[3]);

/* Byte offsets of n items in one buffer, returns the buffer's size (a
 * multiple of align).  Item i holds parameter item_param[i] (-1: not a
 * parameter, never grouped) in the copy tagged item_tag[i] (NULL: all
 * tags equal), bytes[i] long; an item of 0 bytes gets offset 0 and no
 * room.  align is a power of two. */
size_t param_pack_offsets(const ParamList *pl, int n, const int *item_param, const int *item_tag,
                          const size_t *bytes, size_t align, size_t *offset);

#endif
