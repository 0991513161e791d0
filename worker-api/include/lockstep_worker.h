/*
 * lockstep_worker.h — the C ABI between the lockstep host and a compute-backend plugin,
 * version 2.0. The Rust definition is worker-api/src/abi.rs and ops.rs; this header states the
 * same layout for plugins written in C or C++, and its static assertions pin it (the test
 * `the_c_header_compiles_and_pins_the_layout` compiles it).
 *
 * A plugin is a shared library exporting one symbol, `lockstep_worker_entry`, returning a
 * pointer to a static LockstepWorkerVTable. Every function returns an integer status and writes
 * a UTF-8 message (not NUL-terminated) into the host's LockstepErrorBuf. Nothing a plugin
 * exports may unwind or throw into the host. The host never unloads a plugin.
 *
 * ABI 2 adds plugin-owned buffers of 32-bit words and the training step's ops: each op is one
 * LockstepOpCall, defined by lockstep_luts::ops (docs/VERIFICATION.md §9); `run_ops` takes a
 * whole step's sequence in one call. A 1.x plugin (table of at most 80 bytes) is a product-only
 * backend.
 *
 * THE RULES (what a host may rely on, and so what a plugin must do):
 * - Required: a non-NULL table whose abi_major is 1 or 2 and whose struct_size covers the
 *   fields it claims; non-NULL `name` and `description` (static, NUL-terminated UTF-8); non-NULL
 *   `create`, `destroy`, `describe`, `gemm_f32`, `gemm_i8`; both LOCKSTEP_CAP_GEMM_F32 and
 *   LOCKSTEP_CAP_GEMM_I8 set. A plugin that lacks any of these is refused at load. Everything
 *   else is optional: `time_kernel` only with LOCKSTEP_CAP_KERNEL_TIMING, `time_peak` (2.1) only
 *   with LOCKSTEP_CAP_PEAK_TIMING; the five ABI 2
 *   entries only when `ops` is non-zero (then all five are required), and the host hands a
 *   plugin a training step only when `ops` is LOCKSTEP_OPS_ALL.
 * - The units: `gemm_f32` is C = A·Bᵀ (A m×k, B n×k, C m×n, all row-major) through the verified
 *   INT8 units, bit for bit as docs/VERIFICATION.md §1 defines them; `gemm_i8` is the exact
 *   integer product over the full i8 range, summed in wrapping 32-bit arithmetic. The host gates
 *   every plugin (docs/VERIFICATION.md §3) and admits only exact ones. Build C with
 *   -ffp-contract=off (worker-api/examples/c_units.c is a complete, admitted example).
 * - Errors: every call that can fail returns a LOCKSTEP_* status and may write a UTF-8 message
 *   into the host's LockstepErrorBuf: at most `capacity` bytes (the host offers 1024), copied
 *   from the start and cut there (cut on a character boundary), with `len` set to the bytes
 *   written; no NUL is needed. `describe` writes its description the same way and returns OK.
 *   A NaN or ±Inf in A or B is refused with LOCKSTEP_NON_FINITE_INPUT, naming the operand and
 *   index ("in A at index 77").
 * - A refused call writes nothing: after any status other than LOCKSTEP_OK the output holds
 *   what it held before (check operands before writing; the Rust export macro does so for every
 *   Rust plugin). While it gates a plugin, Lockstep's host also keeps its own copy unchanged.
 * - Zero-sized shapes are valid: m = 0 or n = 0 writes nothing and returns OK; k = 0 writes m×n
 *   zeros (+0.0 for gemm_f32, 0 for gemm_i8). Pointers of zero-length operands may be NULL or
 *   dangling and must not be read.
 * - Outputs: write exactly the m×n elements (or `words` words) asked for, nothing before or
 *   after; while it gates a plugin the host surrounds each output with guard words and rejects
 *   a plugin that touches them.
 * - Instances and threads: `create` makes an independent instance; a host calls one instance
 *   from one thread at a time (never concurrently) but may use different instances on
 *   different threads at once, and may move an instance between threads, so instances must not
 *   share mutable state without their own locking, and the plugin keeps no other global mutable
 *   state. `threads` in LockstepCreateOptions is how many threads the instance may use inside a
 *   call (0: all available); a plugin may use fewer. Results never depend on it. A host never
 *   unloads a library (it may load a second copy under another file name for a hot-swap).
 * - Nothing may unwind or throw across these functions, and a plugin must not exit, abort or
 *   install signal handlers: the host gates plugins in a child process and rejects one that
 *   crashes, hangs or writes outside its outputs.
 * - ABI 2 buffers: handles are non-zero and chosen by the plugin; `buffer_create` gives zeroed
 *   words; reads and writes outside a buffer, unknown handles and ops that fail Op::check are
 *   refused with LOCKSTEP_INVALID_ARGUMENT before anything runs; `buffer_free` of an unknown
 *   handle does nothing. An op that fails while it runs (a token id past the vocabulary, a
 *   non-finite operand of a product) fails the call naming the op ("op #3 matmul: …"); the ops
 *   before it have run, and the words it and the ops after it write are undefined.
 */
#ifndef LOCKSTEP_WORKER_H
#define LOCKSTEP_WORKER_H

#include <stddef.h>
#include <stdint.h>

#define LOCKSTEP_ABI_MAJOR 2
#define LOCKSTEP_ABI_MINOR 1
#define LOCKSTEP_ABI_MAJOR_OLDEST 1
#define LOCKSTEP_ENTRY_SYMBOL "lockstep_worker_entry"

/* Status codes. */
#define LOCKSTEP_OK 0
#define LOCKSTEP_INVALID_ARGUMENT 1
#define LOCKSTEP_NON_FINITE_INPUT 2
#define LOCKSTEP_UNSUPPORTED 3
#define LOCKSTEP_DEVICE_ERROR 4
#define LOCKSTEP_PANIC 5
#define LOCKSTEP_INTERNAL 6

/* Capability flags (LockstepWorkerVTable.capabilities). */
#define LOCKSTEP_CAP_GEMM_F32 (1ull << 0)
#define LOCKSTEP_CAP_GEMM_I8 (1ull << 1)
#define LOCKSTEP_CAP_KERNEL_TIMING (1ull << 2)
#define LOCKSTEP_CAP_DEVICE (1ull << 3)
#define LOCKSTEP_CAP_PEAK_TIMING (1ull << 4)
#define LOCKSTEP_CAP_REQUIRED (LOCKSTEP_CAP_GEMM_F32 | LOCKSTEP_CAP_GEMM_I8)
/* Bits 8 and 9 (ABI 1's reserved fused attention and MLP chain) are retired: hosts ignore them. */
#define LOCKSTEP_CAP_RETIRED ((1ull << 8) | (1ull << 9))

/* CreateOptions.flags. */
#define LOCKSTEP_CREATE_HARDWARE_ONLY (1ull << 0)

/* ---- generated from the op table (luts/src/ops/table.rs): do not edit by hand ---- */
/* Op codes (LockstepOpCall.code); bit (1 << code) in LockstepWorkerVTable.ops. */
#define LOCKSTEP_OP_MATMUL 0
#define LOCKSTEP_OP_EMBED 1
#define LOCKSTEP_OP_EMBED_BACKWARD 2
#define LOCKSTEP_OP_LAYER_NORM 3
#define LOCKSTEP_OP_LAYER_NORM_BACKWARD 4
#define LOCKSTEP_OP_GELU 5
#define LOCKSTEP_OP_GELU_BACKWARD 6
#define LOCKSTEP_OP_CAUSAL_SOFTMAX 7
#define LOCKSTEP_OP_CAUSAL_SOFTMAX_BACKWARD 8
#define LOCKSTEP_OP_BIAS_GRAD 9
#define LOCKSTEP_OP_CROSS_ENTROPY 10
#define LOCKSTEP_OP_ADAM 11
#define LOCKSTEP_OP_HASH 12
#define LOCKSTEP_OP_COUNT 13
#define LOCKSTEP_OPS_ALL ((1ull << LOCKSTEP_OP_COUNT) - 1)
/* Lanes of every float sum an op makes (docs/VERIFICATION.md §9, "Lane sums"). */
#define LOCKSTEP_OP_LANES 32

/* LockstepOpCall.flags. */
#define LOCKSTEP_OP_FLAG_ACCUMULATE 1u /* matmul, layer_norm_backward */
#define LOCKSTEP_OP_FLAG_BIAS 2u /* matmul */

/*
 * Each op's record (docs/VERIFICATION.md §9 defines what it computes): its fields in order; a
 * scalar takes its words of `params` (f32 values by their bits), a buffer the next slot of
 * `buffers` and its words of `params` (the offset in words, then a view's row, column and two
 * batch strides), a flag a bit of `flags`; an optional buffer is absent (handle and offset 0)
 * without its flag. LOCKSTEP_P_<OP>_<PARAM> is a word's index in `params`,
 * LOCKSTEP_B_<OP>_<BUFFER> a buffer's index in `buffers`.
 */
/* matmul: buffers a, b, c, bias; params m, n, k, batch0, batch1, a_offset, a_row_stride, a_col_stride, a_batch_stride0, a_batch_stride1, b_offset, b_row_stride, b_col_stride, b_batch_stride0, b_batch_stride1, c_offset, c_row_stride, c_col_stride, c_batch_stride0, c_batch_stride1, bias; flags bias, accumulate */
#define LOCKSTEP_P_MATMUL_M 0
#define LOCKSTEP_P_MATMUL_N 1
#define LOCKSTEP_P_MATMUL_K 2
#define LOCKSTEP_P_MATMUL_BATCH0 3
#define LOCKSTEP_P_MATMUL_BATCH1 4
#define LOCKSTEP_P_MATMUL_A_OFFSET 5
#define LOCKSTEP_P_MATMUL_A_ROW_STRIDE 6
#define LOCKSTEP_P_MATMUL_A_COL_STRIDE 7
#define LOCKSTEP_P_MATMUL_A_BATCH_STRIDE0 8
#define LOCKSTEP_P_MATMUL_A_BATCH_STRIDE1 9
#define LOCKSTEP_P_MATMUL_B_OFFSET 10
#define LOCKSTEP_P_MATMUL_B_ROW_STRIDE 11
#define LOCKSTEP_P_MATMUL_B_COL_STRIDE 12
#define LOCKSTEP_P_MATMUL_B_BATCH_STRIDE0 13
#define LOCKSTEP_P_MATMUL_B_BATCH_STRIDE1 14
#define LOCKSTEP_P_MATMUL_C_OFFSET 15
#define LOCKSTEP_P_MATMUL_C_ROW_STRIDE 16
#define LOCKSTEP_P_MATMUL_C_COL_STRIDE 17
#define LOCKSTEP_P_MATMUL_C_BATCH_STRIDE0 18
#define LOCKSTEP_P_MATMUL_C_BATCH_STRIDE1 19
#define LOCKSTEP_P_MATMUL_BIAS 20
#define LOCKSTEP_B_MATMUL_A 0
#define LOCKSTEP_B_MATMUL_B 1
#define LOCKSTEP_B_MATMUL_C 2
#define LOCKSTEP_B_MATMUL_BIAS 3
/* embed: buffers tokens, tok, pos, out; params rows, seq, width, vocab, tokens, tok, pos, out */
#define LOCKSTEP_P_EMBED_ROWS 0
#define LOCKSTEP_P_EMBED_SEQ 1
#define LOCKSTEP_P_EMBED_WIDTH 2
#define LOCKSTEP_P_EMBED_VOCAB 3
#define LOCKSTEP_P_EMBED_TOKENS 4
#define LOCKSTEP_P_EMBED_TOK 5
#define LOCKSTEP_P_EMBED_POS 6
#define LOCKSTEP_P_EMBED_OUT 7
#define LOCKSTEP_B_EMBED_TOKENS 0
#define LOCKSTEP_B_EMBED_TOK 1
#define LOCKSTEP_B_EMBED_POS 2
#define LOCKSTEP_B_EMBED_OUT 3
/* embed_backward: buffers tokens, dy, dtok, dpos; params rows, seq, width, vocab, positions, tokens, dy, dtok, dpos */
#define LOCKSTEP_P_EMBED_BACKWARD_ROWS 0
#define LOCKSTEP_P_EMBED_BACKWARD_SEQ 1
#define LOCKSTEP_P_EMBED_BACKWARD_WIDTH 2
#define LOCKSTEP_P_EMBED_BACKWARD_VOCAB 3
#define LOCKSTEP_P_EMBED_BACKWARD_POSITIONS 4
#define LOCKSTEP_P_EMBED_BACKWARD_TOKENS 5
#define LOCKSTEP_P_EMBED_BACKWARD_DY 6
#define LOCKSTEP_P_EMBED_BACKWARD_DTOK 7
#define LOCKSTEP_P_EMBED_BACKWARD_DPOS 8
#define LOCKSTEP_B_EMBED_BACKWARD_TOKENS 0
#define LOCKSTEP_B_EMBED_BACKWARD_DY 1
#define LOCKSTEP_B_EMBED_BACKWARD_DTOK 2
#define LOCKSTEP_B_EMBED_BACKWARD_DPOS 3
/* layer_norm: buffers x, gain, bias, y, xhat, rstd; params rows, width, x, gain, bias, y, xhat, rstd */
#define LOCKSTEP_P_LAYER_NORM_ROWS 0
#define LOCKSTEP_P_LAYER_NORM_WIDTH 1
#define LOCKSTEP_P_LAYER_NORM_X 2
#define LOCKSTEP_P_LAYER_NORM_GAIN 3
#define LOCKSTEP_P_LAYER_NORM_BIAS 4
#define LOCKSTEP_P_LAYER_NORM_Y 5
#define LOCKSTEP_P_LAYER_NORM_XHAT 6
#define LOCKSTEP_P_LAYER_NORM_RSTD 7
#define LOCKSTEP_B_LAYER_NORM_X 0
#define LOCKSTEP_B_LAYER_NORM_GAIN 1
#define LOCKSTEP_B_LAYER_NORM_BIAS 2
#define LOCKSTEP_B_LAYER_NORM_Y 3
#define LOCKSTEP_B_LAYER_NORM_XHAT 4
#define LOCKSTEP_B_LAYER_NORM_RSTD 5
/* layer_norm_backward: buffers dy, xhat, rstd, gain, dx, dgain, dbias; params rows, width, dy, xhat, rstd, gain, dx, dgain, dbias; flags accumulate */
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_ROWS 0
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_WIDTH 1
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_DY 2
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_XHAT 3
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_RSTD 4
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_GAIN 5
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_DX 6
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_DGAIN 7
#define LOCKSTEP_P_LAYER_NORM_BACKWARD_DBIAS 8
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_DY 0
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_XHAT 1
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_RSTD 2
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_GAIN 3
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_DX 4
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_DGAIN 5
#define LOCKSTEP_B_LAYER_NORM_BACKWARD_DBIAS 6
/* gelu: buffers x, y; params len, x, y */
#define LOCKSTEP_P_GELU_LEN 0
#define LOCKSTEP_P_GELU_X 1
#define LOCKSTEP_P_GELU_Y 2
#define LOCKSTEP_B_GELU_X 0
#define LOCKSTEP_B_GELU_Y 1
/* gelu_backward: buffers dy, x, dx; params len, dy, x, dx */
#define LOCKSTEP_P_GELU_BACKWARD_LEN 0
#define LOCKSTEP_P_GELU_BACKWARD_DY 1
#define LOCKSTEP_P_GELU_BACKWARD_X 2
#define LOCKSTEP_P_GELU_BACKWARD_DX 3
#define LOCKSTEP_B_GELU_BACKWARD_DY 0
#define LOCKSTEP_B_GELU_BACKWARD_X 1
#define LOCKSTEP_B_GELU_BACKWARD_DX 2
/* causal_softmax: buffers scores; params blocks, t, scale, scores */
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BLOCKS 0
#define LOCKSTEP_P_CAUSAL_SOFTMAX_T 1
#define LOCKSTEP_P_CAUSAL_SOFTMAX_SCALE 2
#define LOCKSTEP_P_CAUSAL_SOFTMAX_SCORES 3
#define LOCKSTEP_B_CAUSAL_SOFTMAX_SCORES 0
/* causal_softmax_backward: buffers probs, dprobs, dscores; params blocks, t, scale, probs, dprobs, dscores */
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_BLOCKS 0
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_T 1
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_SCALE 2
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_PROBS 3
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_DPROBS 4
#define LOCKSTEP_P_CAUSAL_SOFTMAX_BACKWARD_DSCORES 5
#define LOCKSTEP_B_CAUSAL_SOFTMAX_BACKWARD_PROBS 0
#define LOCKSTEP_B_CAUSAL_SOFTMAX_BACKWARD_DPROBS 1
#define LOCKSTEP_B_CAUSAL_SOFTMAX_BACKWARD_DSCORES 2
/* bias_grad: buffers dy, db; params rows, width, dy, db */
#define LOCKSTEP_P_BIAS_GRAD_ROWS 0
#define LOCKSTEP_P_BIAS_GRAD_WIDTH 1
#define LOCKSTEP_P_BIAS_GRAD_DY 2
#define LOCKSTEP_P_BIAS_GRAD_DB 3
#define LOCKSTEP_B_BIAS_GRAD_DY 0
#define LOCKSTEP_B_BIAS_GRAD_DB 1
/* cross_entropy: buffers logits, targets, dlogits, loss; params rows, vocab, logits, targets, dlogits, loss */
#define LOCKSTEP_P_CROSS_ENTROPY_ROWS 0
#define LOCKSTEP_P_CROSS_ENTROPY_VOCAB 1
#define LOCKSTEP_P_CROSS_ENTROPY_LOGITS 2
#define LOCKSTEP_P_CROSS_ENTROPY_TARGETS 3
#define LOCKSTEP_P_CROSS_ENTROPY_DLOGITS 4
#define LOCKSTEP_P_CROSS_ENTROPY_LOSS 5
#define LOCKSTEP_B_CROSS_ENTROPY_LOGITS 0
#define LOCKSTEP_B_CROSS_ENTROPY_TARGETS 1
#define LOCKSTEP_B_CROSS_ENTROPY_DLOGITS 2
#define LOCKSTEP_B_CROSS_ENTROPY_LOSS 3
/* adam: buffers weights, grad, m, v; params len, lr, correction1, correction2, weights, grad, m, v */
#define LOCKSTEP_P_ADAM_LEN 0
#define LOCKSTEP_P_ADAM_LR 1
#define LOCKSTEP_P_ADAM_CORRECTION1 2
#define LOCKSTEP_P_ADAM_CORRECTION2 3
#define LOCKSTEP_P_ADAM_WEIGHTS 4
#define LOCKSTEP_P_ADAM_GRAD 5
#define LOCKSTEP_P_ADAM_M 6
#define LOCKSTEP_P_ADAM_V 7
#define LOCKSTEP_B_ADAM_WEIGHTS 0
#define LOCKSTEP_B_ADAM_GRAD 1
#define LOCKSTEP_B_ADAM_M 2
#define LOCKSTEP_B_ADAM_V 3
/* hash: buffers data, out; params len, data, out */
#define LOCKSTEP_P_HASH_LEN 0
#define LOCKSTEP_P_HASH_DATA 1
#define LOCKSTEP_P_HASH_OUT 2
#define LOCKSTEP_B_HASH_DATA 0
#define LOCKSTEP_B_HASH_OUT 1
/* ---- end of the generated op constants ---- */
typedef struct LockstepErrorBuf {
    uint8_t *ptr;
    uint32_t capacity;
    uint32_t len; /* set by the plugin */
} LockstepErrorBuf;

typedef struct LockstepCreateOptions {
    uint32_t struct_size;
    uint32_t threads; /* 0: all available */
    uint64_t flags;
    const uint8_t *adapter; /* (1.2) UTF-8, not NUL-terminated; may be NULL */
    uint32_t adapter_len;
    uint32_t tile[5]; /* (1.2) [tm, tn, wx, wy, kb]; all zero: the plugin's choice */
} LockstepCreateOptions;

/* One op: see the generated op constants above for where each op's parameters are. */
typedef struct LockstepOpCall {
    uint32_t code;
    uint32_t flags;
    uint64_t buffers[8];
    uint32_t params[24];
} LockstepOpCall;

typedef int32_t (*LockstepCreateFn)(const LockstepCreateOptions *options, void **out, LockstepErrorBuf *error);
typedef void (*LockstepDestroyFn)(void *instance);
typedef int32_t (*LockstepDescribeFn)(void *instance, LockstepErrorBuf *out);
typedef int32_t (*LockstepGemmF32Fn)(void *instance, uint32_t m, uint32_t n, uint32_t k, const float *a,
                                     const float *b, float *c, LockstepErrorBuf *error);
typedef int32_t (*LockstepGemmI8Fn)(void *instance, uint32_t m, uint32_t n, uint32_t k, const int8_t *a,
                                    const int8_t *b, int32_t *c, LockstepErrorBuf *error);
typedef int32_t (*LockstepTimeKernelFn)(void *instance, uint32_t m, uint32_t n, uint32_t k, uint32_t repeat,
                                        double *out_seconds, LockstepErrorBuf *error);
typedef int32_t (*LockstepBufferCreateFn)(void *instance, uint64_t words, uint64_t *out, LockstepErrorBuf *error);
typedef void (*LockstepBufferFreeFn)(void *instance, uint64_t handle);
typedef int32_t (*LockstepBufferWriteFn)(void *instance, uint64_t handle, uint64_t offset, const uint32_t *src,
                                         uint64_t words, LockstepErrorBuf *error);
typedef int32_t (*LockstepBufferReadFn)(void *instance, uint64_t handle, uint64_t offset, uint32_t *dst,
                                        uint64_t words, LockstepErrorBuf *error);
typedef int32_t (*LockstepRunOpsFn)(void *instance, const LockstepOpCall *ops, uint32_t count,
                                    LockstepErrorBuf *error);
/* time_peak (2.1, with LOCKSTEP_CAP_PEAK_TIMING): int8 operations per second of the product path
 * in a register-resident loop, run `repeat` times. */
typedef int32_t (*LockstepTimePeakFn)(void *instance, uint32_t repeat, double *out_ops_per_second,
                                      LockstepErrorBuf *error);

typedef struct LockstepWorkerVTable {
    uint16_t abi_major;
    uint16_t abi_minor;
    uint32_t struct_size;
    uint64_t capabilities;
    const char *name;
    const char *description;
    LockstepCreateFn create;
    LockstepDestroyFn destroy;
    LockstepDescribeFn describe;
    LockstepGemmF32Fn gemm_f32;
    LockstepGemmI8Fn gemm_i8;
    /* 1.1 */
    LockstepTimeKernelFn time_kernel;
    /* 2.0 */
    uint64_t ops;
    LockstepBufferCreateFn buffer_create;
    LockstepBufferFreeFn buffer_free;
    LockstepBufferWriteFn buffer_write;
    LockstepBufferReadFn buffer_read;
    LockstepRunOpsFn run_ops;
    /* 2.1 */
    LockstepTimePeakFn time_peak;
} LockstepWorkerVTable;

typedef const LockstepWorkerVTable *(*LockstepEntryFn)(void);

/* The layout, pinned (64-bit targets), the same numbers as the Rust layout tests. */
_Static_assert(sizeof(LockstepWorkerVTable) == 136, "table size");
_Static_assert(offsetof(LockstepWorkerVTable, time_peak) == 128, "2.1 field");
_Static_assert(offsetof(LockstepWorkerVTable, time_kernel) == 72, "1.1 field");
_Static_assert(offsetof(LockstepWorkerVTable, ops) == 80, "2.0 fields start after 1.x's 80 bytes");
_Static_assert(offsetof(LockstepWorkerVTable, run_ops) == 120, "run_ops");
_Static_assert(sizeof(LockstepCreateOptions) == 48, "options size");
_Static_assert(offsetof(LockstepCreateOptions, tile) == 28, "tile");
_Static_assert(sizeof(LockstepErrorBuf) == 16, "error buffer");
_Static_assert(sizeof(LockstepOpCall) == 168, "op record");
_Static_assert(offsetof(LockstepOpCall, buffers) == 8, "op buffers");
_Static_assert(offsetof(LockstepOpCall, params) == 72, "op params");

#endif /* LOCKSTEP_WORKER_H */
