/*
 * The units in portable C, written from include/lockstep_worker.h and docs/VERIFICATION.md §1
 * alone: a products-only plugin of ABI 2.0 (`ops` = 0). A test compiles it with `cc` and gates
 * it (backends/host/tests/plugins.rs): the header and its documentation are enough for an
 * outsider to build a plugin the gate admits.
 *
 * Build: cc -std=c11 -O2 -ffp-contract=off -fPIC -shared -I../include c_units.c -o libc_units.so
 * (-ffp-contract=off: the epilogue's additions must each round on their own; on x86-64 float
 * arithmetic is binary32 already.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep_worker.h"

#define BLOCK 32u

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Writes `message` into the host's buffer, truncated to its capacity. */
static int32_t fail(LockstepErrorBuf *error, int32_t status, const char *message) {
    if (error != NULL && error->ptr != NULL) {
        size_t len = strlen(message);
        if (len > error->capacity) {
            len = error->capacity;
        }
        memcpy(error->ptr, message, len);
        error->len = (uint32_t)len;
    }
    return status;
}

/* §1.3: the smallest e with amax <= 127 * 2^e; 0 for a block without a normal value. */
static int32_t block_exponent(uint32_t amax_bits) {
    int32_t biased = (int32_t)(amax_bits >> 23);
    if (biased == 0) {
        return 0;
    }
    uint32_t mantissa = (amax_bits & 0x007fffffu) | 0x00800000u;
    int32_t e = biased - 133;
    return mantissa > (127u << 17) ? e + 1 : e;
}

/* §1.4: round_half_even(x / 2^e) on the bits; zeros and subnormals give 0. */
static int32_t quantize_value(uint32_t bits, int32_t e) {
    int32_t biased = (int32_t)((bits >> 23) & 0xffu);
    if (biased == 0) {
        return 0;
    }
    uint32_t mantissa = (bits & 0x007fffffu) | 0x00800000u;
    int32_t shift = 150 + e - biased;
    int32_t magnitude = 0;
    if (shift <= 24) {
        uint32_t truncated = mantissa >> shift;
        uint32_t remainder = mantissa & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        magnitude = (int32_t)truncated;
        if (remainder > half || (remainder == half && (truncated & 1u))) {
            magnitude += 1;
        }
    }
    return (bits >> 31) ? -magnitude : magnitude;
}

/* §1.6: acc * 2^s on the bits: +0 below the normal range, +-Inf above it. */
static float block_term(int32_t acc, int32_t s) {
    if (acc == 0) {
        return 0.0f;
    }
    uint32_t bits = bits_of((float)acc); /* exact: |acc| < 2^24 */
    int32_t biased = (int32_t)((bits >> 23) & 0xffu) + s;
    if (biased <= 0) {
        return 0.0f;
    }
    if (biased >= 255) {
        return float_of(acc < 0 ? 0xff800000u : 0x7f800000u);
    }
    return float_of((bits & 0x807fffffu) | ((uint32_t)biased << 23));
}

/* Quantizes `rows` rows of `k` into `q` (rows * blocks * BLOCK) and `e` (rows * blocks). */
static void quantize(const float *x, uint32_t rows, uint32_t k, uint32_t blocks, int8_t *q, int32_t *e) {
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t b = 0; b < blocks; b++) {
            uint32_t start = b * BLOCK, end = start + BLOCK < k ? start + BLOCK : k;
            uint32_t amax = 0;
            for (uint32_t l = start; l < end; l++) {
                uint32_t m = bits_of(x[(size_t)r * k + l]) & 0x7fffffffu;
                amax = m > amax ? m : amax;
            }
            int32_t ex = block_exponent(amax);
            e[(size_t)r * blocks + b] = ex;
            int8_t *out = q + ((size_t)r * blocks + b) * BLOCK;
            memset(out, 0, BLOCK);
            for (uint32_t l = start; l < end; l++) {
                out[l - start] = (int8_t)quantize_value(bits_of(x[(size_t)r * k + l]), ex);
            }
        }
    }
}

/* The first non-finite value of `n`, or -1. */
static long first_non_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if ((bits_of(x[i]) & 0x7f800000u) == 0x7f800000u) {
            return (long)i;
        }
    }
    return -1;
}

static int32_t create(const LockstepCreateOptions *options, void **out, LockstepErrorBuf *error) {
    (void)options; /* no threads, no device: every option is fine */
    void *instance = malloc(1);
    if (instance == NULL) {
        return fail(error, LOCKSTEP_INTERNAL, "out of memory");
    }
    *out = instance;
    return LOCKSTEP_OK;
}

static void destroy(void *instance) { free(instance); }

static int32_t describe(void *instance, LockstepErrorBuf *out) {
    (void)instance;
    fail(out, LOCKSTEP_OK, "portable C, one thread");
    return LOCKSTEP_OK;
}

static int32_t gemm_f32(void *instance, uint32_t m, uint32_t n, uint32_t k, const float *a, const float *b,
                        float *c, LockstepErrorBuf *error) {
    (void)instance;
    /* Refuse before writing anything: the output is untouched after a refused call. */
    const float *operands[2] = {a, b};
    const size_t lengths[2] = {(size_t)m * k, (size_t)n * k};
    for (int which = 0; which < 2; which++) {
        long at = first_non_finite(operands[which], lengths[which]);
        if (at >= 0) {
            char message[160];
            snprintf(message, sizeof message, "non-finite input in %s at index %ld (bits %#010x)", which ? "B" : "A",
                     at, (unsigned)bits_of(operands[which][at]));
            return fail(error, LOCKSTEP_NON_FINITE_INPUT, message);
        }
    }
    if (m == 0 || n == 0) {
        return LOCKSTEP_OK; /* nothing to write */
    }
    uint32_t blocks = (k + BLOCK - 1) / BLOCK;
    int8_t *qa = malloc((size_t)m * blocks * BLOCK + 1), *qb = malloc((size_t)n * blocks * BLOCK + 1);
    int32_t *ea = malloc(((size_t)m * blocks + 1) * sizeof *ea), *eb = malloc(((size_t)n * blocks + 1) * sizeof *eb);
    if (!qa || !qb || !ea || !eb) {
        free(qa), free(qb), free(ea), free(eb);
        return fail(error, LOCKSTEP_INTERNAL, "out of memory");
    }
    quantize(a, m, k, blocks, qa, ea);
    quantize(b, n, k, blocks, qb, eb);
    for (uint32_t i = 0; i < m; i++) {
        for (uint32_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (uint32_t blk = 0; blk < blocks; blk++) {
                const int8_t *x = qa + ((size_t)i * blocks + blk) * BLOCK, *y = qb + ((size_t)j * blocks + blk) * BLOCK;
                int32_t acc = 0;
                for (uint32_t l = 0; l < BLOCK; l++) {
                    acc += (int32_t)x[l] * (int32_t)y[l];
                }
                float term = block_term(acc, ea[(size_t)i * blocks + blk] + eb[(size_t)j * blocks + blk]);
                sum = sum + term;
                if ((bits_of(sum) & 0x7fffffffu) < 0x00800000u) {
                    sum = 0.0f; /* §1.7: partial sums below 2^-126 become +0 */
                }
            }
            if ((bits_of(sum) & 0x7fffffffu) > 0x7f800000u) {
                sum = float_of(0x7fc00000u); /* the canonical NaN */
            }
            c[(size_t)i * n + j] = sum;
        }
    }
    free(qa), free(qb), free(ea), free(eb);
    return LOCKSTEP_OK;
}

static int32_t gemm_i8(void *instance, uint32_t m, uint32_t n, uint32_t k, const int8_t *a, const int8_t *b,
                       int32_t *c, LockstepErrorBuf *error) {
    (void)instance;
    (void)error;
    for (uint32_t i = 0; i < m; i++) {
        for (uint32_t j = 0; j < n; j++) {
            uint32_t acc = 0; /* wrapping, as the ABI says */
            for (uint32_t l = 0; l < k; l++) {
                acc += (uint32_t)((int32_t)a[(size_t)i * k + l] * (int32_t)b[(size_t)j * k + l]);
            }
            c[(size_t)i * n + j] = (int32_t)acc;
        }
    }
    return LOCKSTEP_OK;
}

static const LockstepWorkerVTable TABLE = {
    .abi_major = LOCKSTEP_ABI_MAJOR,
    .abi_minor = LOCKSTEP_ABI_MINOR,
    .struct_size = sizeof(LockstepWorkerVTable),
    .capabilities = LOCKSTEP_CAP_REQUIRED,
    .name = "c-units",
    .description = "the units in portable C, from lockstep_worker.h alone (test plugin)",
    .create = create,
    .destroy = destroy,
    .describe = describe,
    .gemm_f32 = gemm_f32,
    .gemm_i8 = gemm_i8,
    .ops = 0, /* products only: the host runs the step's other ops */
};

const LockstepWorkerVTable *lockstep_worker_entry(void) { return &TABLE; }
