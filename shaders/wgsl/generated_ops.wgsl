// Generated from the op table (luts/src/ops/table.rs) by lockstep_luts::ops::generate: do not
// edit by hand (the test `the_generated_prelude_is_current` rewrites it). A step kernel reads
// its op's parameters by these names: the op's ABI params, each buffer offset turned into a
// word address of the arena.

// matmul (code 0): buffers a, b, c, bias; params m, n, k, batch0, batch1, a_offset, a_row_stride, a_col_stride, a_batch_stride0, a_batch_stride1, b_offset, b_row_stride, b_col_stride, b_batch_stride0, b_batch_stride1, c_offset, c_row_stride, c_col_stride, c_batch_stride0, c_batch_stride1, bias; flags bias, accumulate
const MATMUL_M: u32 = 0u;
const MATMUL_N: u32 = 1u;
const MATMUL_K: u32 = 2u;
const MATMUL_BATCH0: u32 = 3u;
const MATMUL_BATCH1: u32 = 4u;
const MATMUL_A_OFFSET: u32 = 5u;
const MATMUL_A_ROW_STRIDE: u32 = 6u;
const MATMUL_A_COL_STRIDE: u32 = 7u;
const MATMUL_A_BATCH_STRIDE0: u32 = 8u;
const MATMUL_A_BATCH_STRIDE1: u32 = 9u;
const MATMUL_B_OFFSET: u32 = 10u;
const MATMUL_B_ROW_STRIDE: u32 = 11u;
const MATMUL_B_COL_STRIDE: u32 = 12u;
const MATMUL_B_BATCH_STRIDE0: u32 = 13u;
const MATMUL_B_BATCH_STRIDE1: u32 = 14u;
const MATMUL_C_OFFSET: u32 = 15u;
const MATMUL_C_ROW_STRIDE: u32 = 16u;
const MATMUL_C_COL_STRIDE: u32 = 17u;
const MATMUL_C_BATCH_STRIDE0: u32 = 18u;
const MATMUL_C_BATCH_STRIDE1: u32 = 19u;
const MATMUL_BIAS: u32 = 20u;

// embed (code 1): buffers tokens, tok, pos, out; params rows, seq, width, vocab, tokens, tok, pos, out
const EMBED_ROWS: u32 = 0u;
const EMBED_SEQ: u32 = 1u;
const EMBED_WIDTH: u32 = 2u;
const EMBED_VOCAB: u32 = 3u;
const EMBED_TOKENS: u32 = 4u;
const EMBED_TOK: u32 = 5u;
const EMBED_POS: u32 = 6u;
const EMBED_OUT: u32 = 7u;

// embed_backward (code 2): buffers tokens, dy, dtok, dpos; params rows, seq, width, vocab, positions, tokens, dy, dtok, dpos
const EMBED_BACKWARD_ROWS: u32 = 0u;
const EMBED_BACKWARD_SEQ: u32 = 1u;
const EMBED_BACKWARD_WIDTH: u32 = 2u;
const EMBED_BACKWARD_VOCAB: u32 = 3u;
const EMBED_BACKWARD_POSITIONS: u32 = 4u;
const EMBED_BACKWARD_TOKENS: u32 = 5u;
const EMBED_BACKWARD_DY: u32 = 6u;
const EMBED_BACKWARD_DTOK: u32 = 7u;
const EMBED_BACKWARD_DPOS: u32 = 8u;

// layer_norm (code 3): buffers x, gain, bias, y, xhat, rstd; params rows, width, x, gain, bias, y, xhat, rstd
const LAYER_NORM_ROWS: u32 = 0u;
const LAYER_NORM_WIDTH: u32 = 1u;
const LAYER_NORM_X: u32 = 2u;
const LAYER_NORM_GAIN: u32 = 3u;
const LAYER_NORM_BIAS: u32 = 4u;
const LAYER_NORM_Y: u32 = 5u;
const LAYER_NORM_XHAT: u32 = 6u;
const LAYER_NORM_RSTD: u32 = 7u;

// layer_norm_backward (code 4): buffers dy, xhat, rstd, gain, dx, dgain, dbias; params rows, width, dy, xhat, rstd, gain, dx, dgain, dbias; flags accumulate
const LAYER_NORM_BACKWARD_ROWS: u32 = 0u;
const LAYER_NORM_BACKWARD_WIDTH: u32 = 1u;
const LAYER_NORM_BACKWARD_DY: u32 = 2u;
const LAYER_NORM_BACKWARD_XHAT: u32 = 3u;
const LAYER_NORM_BACKWARD_RSTD: u32 = 4u;
const LAYER_NORM_BACKWARD_GAIN: u32 = 5u;
const LAYER_NORM_BACKWARD_DX: u32 = 6u;
const LAYER_NORM_BACKWARD_DGAIN: u32 = 7u;
const LAYER_NORM_BACKWARD_DBIAS: u32 = 8u;

// gelu (code 5): buffers x, y; params len, x, y
const GELU_LEN: u32 = 0u;
const GELU_X: u32 = 1u;
const GELU_Y: u32 = 2u;

// gelu_backward (code 6): buffers dy, x, dx; params len, dy, x, dx
const GELU_BACKWARD_LEN: u32 = 0u;
const GELU_BACKWARD_DY: u32 = 1u;
const GELU_BACKWARD_X: u32 = 2u;
const GELU_BACKWARD_DX: u32 = 3u;

// causal_softmax (code 7): buffers scores; params blocks, t, scale, scores
const CAUSAL_SOFTMAX_BLOCKS: u32 = 0u;
const CAUSAL_SOFTMAX_T: u32 = 1u;
const CAUSAL_SOFTMAX_SCALE: u32 = 2u;
const CAUSAL_SOFTMAX_SCORES: u32 = 3u;

// causal_softmax_backward (code 8): buffers probs, dprobs, dscores; params blocks, t, scale, probs, dprobs, dscores
const CAUSAL_SOFTMAX_BACKWARD_BLOCKS: u32 = 0u;
const CAUSAL_SOFTMAX_BACKWARD_T: u32 = 1u;
const CAUSAL_SOFTMAX_BACKWARD_SCALE: u32 = 2u;
const CAUSAL_SOFTMAX_BACKWARD_PROBS: u32 = 3u;
const CAUSAL_SOFTMAX_BACKWARD_DPROBS: u32 = 4u;
const CAUSAL_SOFTMAX_BACKWARD_DSCORES: u32 = 5u;

// bias_grad (code 9): buffers dy, db; params rows, width, dy, db
const BIAS_GRAD_ROWS: u32 = 0u;
const BIAS_GRAD_WIDTH: u32 = 1u;
const BIAS_GRAD_DY: u32 = 2u;
const BIAS_GRAD_DB: u32 = 3u;

// cross_entropy (code 10): buffers logits, targets, dlogits, loss; params rows, vocab, logits, targets, dlogits, loss
const CROSS_ENTROPY_ROWS: u32 = 0u;
const CROSS_ENTROPY_VOCAB: u32 = 1u;
const CROSS_ENTROPY_LOGITS: u32 = 2u;
const CROSS_ENTROPY_TARGETS: u32 = 3u;
const CROSS_ENTROPY_DLOGITS: u32 = 4u;
const CROSS_ENTROPY_LOSS: u32 = 5u;

// adam (code 11): buffers weights, grad, m, v; params len, lr, correction1, correction2, weights, grad, m, v
const ADAM_LEN: u32 = 0u;
const ADAM_LR: u32 = 1u;
const ADAM_CORRECTION1: u32 = 2u;
const ADAM_CORRECTION2: u32 = 3u;
const ADAM_WEIGHTS: u32 = 4u;
const ADAM_GRAD: u32 = 5u;
const ADAM_M: u32 = 6u;
const ADAM_V: u32 = 7u;

// hash (code 12): buffers data, out; params len, data, out
const HASH_LEN: u32 = 0u;
const HASH_DATA: u32 = 1u;
const HASH_OUT: u32 = 2u;

// Flags (the record's flag word).
const FLAG_ACCUMULATE: u32 = 1u;
const FLAG_BIAS: u32 = 2u;

// The definitions' constants (lockstep_luts::ops, lockstep_luts::hash), as bits.
const LN_EPS: u32 = 0x3727c5acu;
const ADAM_BETA1: u32 = 0x3f666666u;
const ADAM_BETA2: u32 = 0x3f733333u;
const ADAM_EPS: u32 = 0x322bcc77u;
const LANES: u32 = 32u;
const HASH_CHUNK: u32 = 4096u;
const FNV_BASIS: u32 = 0x811c9dc5u;
const FNV_PRIME: u32 = 0x01000193u;
