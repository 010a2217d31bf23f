/* Helpers shared by every ISA variant of the fused kernels (am_fused.c). */
#ifndef AM_FUSED_COMMON_H
#define AM_FUSED_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define AM_ABI_VERSION 6

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AM_X86_SIMD 1
#else
#define AM_X86_SIMD 0
#endif

#if defined(_WIN32)
#define AM_EXPORT __declspec(dllexport)
#else
#define AM_EXPORT __attribute__((visibility("default")))
#endif

/* Elements per block of a reduce pass: each block's sums are accumulated in the
   parameter dtype in the vector lanes (AM_LANES float lanes of the variant: at most 128
   terms per lane, a relative error below 128 float ulps for non-negative terms), then
   added to double accumulators. Smaller blocks spend a measurable share of the reduce
   in the per-block combination (on AMD Zen 3, 1024-element AVX2 blocks made a step from
   memory about 2 % faster than 512). */
#define AM_BLOCK (128 * AM_LANES)
/* A float block is summed again in double unless the sum of its non-negative terms lies
   in [AM_SAFE_MIN, AM_SAFE_MAX]: below, its terms may be subnormal (precision lost, or
   flushed to zero); above, some may have overflowed. */
#define AM_SAFE_MIN 0x1p-100f
#define AM_SAFE_MAX 0x1p100f
/* Tensors of at least this many elements are split across the OpenMP threads. */
#define AM_PAR_MIN 65536
#define AM_MAX_SUMS 3
#define AM_MAX_THREADS 256
#define AM_INLINE static inline __attribute__((always_inline))
/* The apply pass walks a range in chunks of AM_CHUNK elements taken from the end: the
   chunks the reduce pass read last are still in the last-level cache. Each chunk is
   walked forwards, the direction the hardware prefetchers follow best. There is no
   software prefetching: measured on AVX-512 and AVX2 code, a prefetch 1-4 KiB ahead
   of each stream made both passes 10-30 % slower than the hardware prefetchers alone. */
#define AM_CHUNK 262144
#define AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)                                                  \
    for (int64_t c1 = (hi); c1 > (lo); c1 -= AM_CHUNK) {                                     \
        int64_t c0 = c1 - AM_CHUNK > (lo) ? c1 - AM_CHUNK : (lo);
#define AM_CHUNKS_END }

/* Neumaier-compensated double sum of the block sums: at least as accurate as torch.sum,
   and deterministic for a given number of threads. */
typedef struct {
    double s, c;
} am_sum;

static inline void am_add(am_sum *a, double x) {
    double t = a->s + x;
    if (isfinite(t)) {
        if (fabs(a->s) >= fabs(x))
            a->c += (a->s - t) + x;
        else
            a->c += (x - t) + a->s;
    }
    a->s = t;
}

static inline double am_value(const am_sum *a) { return isfinite(a->s) ? a->s + a->c : a->s; }

static inline int am_nthreads(int64_t n, int64_t requested) {
    if (requested > AM_MAX_THREADS) requested = AM_MAX_THREADS;
    return (requested > 1 && n >= AM_PAR_MIN) ? (int)requested : 1;
}

/* Contiguous, cache-line aligned ranges, the same in both passes over a tensor. */
static inline void am_range(int64_t n, int tid, int nthr, int64_t *lo, int64_t *hi) {
    int64_t a = (n * tid) / nthr, b = (n * (tid + 1)) / nthr;
    if (tid > 0) a &= ~(int64_t)15;
    if (tid < nthr - 1) b &= ~(int64_t)15;
    *lo = a;
    *hi = b;
}

/* Per-thread partial sums, added in thread order. */
static inline void am_combine(am_sum *parts, int nthr, int nsums, double *out) {
    for (int k = 0; k < nsums; k++) {
        am_sum acc = {0.0, 0.0};
        for (int t = 0; t < nthr; t++) am_add(&acc, am_value(&parts[t * AM_MAX_SUMS + k]));
        out[k] = am_value(&acc);
    }
}

/* Whether a[i] and b[i] (b may be NULL) are all zero on [lo, hi). */
static inline int am_all_zero(int64_t lo, int64_t hi, const float *a, const float *b) {
    int nz = 0;
    for (int64_t i = lo; i < hi; i++) nz |= (a[i] != 0.0f) | (b != NULL && b[i] != 0.0f);
    return !nz;
}

/* Whether the float block sum chk (of non-negative terms) is outside the safe range
   [lo_bound, AM_SAFE_MAX] and the block is not simply zero: then it is summed again in
   double. */
#define AM_UNSAFE(chk, lo_bound, lo, hi, a, b)                                              \
    (!((chk) >= (lo_bound) && (chk) <= AM_SAFE_MAX) && !am_all_zero(lo, hi, a, b))

#define AM_THREAD_ID(tid, T)                                                                 \
    int tid = 0, T = 1;                                                                      \
    AM_THREAD_ID_OMP(tid, T)
#ifdef _OPENMP
#define AM_THREAD_ID_OMP(tid, T)                                                             \
    tid = omp_get_thread_num();                                                              \
    T = omp_get_num_threads();
#else
#define AM_THREAD_ID_OMP(tid, T)
#endif

/* Runs the statements ... on every thread's range [lo, hi) of n elements, with acc the
   thread's zeroed compensated sums, then adds the threads' sums in thread order into
   out[0..nsums). */
#define AM_PARALLEL_REDUCE(n, nt, nsums, out, ...)                                          \
    do {                                                                                     \
        int nthr_ = am_nthreads(n, nt), used_ = 1;                                           \
        (void)nthr_; /* unused without OpenMP */                                             \
        am_sum parts_[AM_MAX_SUMS * AM_MAX_THREADS];                                         \
        _Pragma("omp parallel num_threads(nthr_) if (nthr_ > 1)") {                          \
            AM_THREAD_ID(tid, T)                                                             \
            if (tid == 0) used_ = T;                                                         \
            int64_t lo, hi;                                                                  \
            am_range(n, tid, T, &lo, &hi);                                                   \
            am_sum *acc = &parts_[tid * AM_MAX_SUMS];                                        \
            for (int j_ = 0; j_ < AM_MAX_SUMS; j_++) acc[j_].s = acc[j_].c = 0.0;            \
            __VA_ARGS__                                                                      \
        }                                                                                    \
        am_combine(parts_, used_, nsums, out);                                               \
    } while (0)

/* Runs the statements ... on every thread's range [lo, hi) of n elements. */
#define AM_PARALLEL_APPLY(n, nt, ...)                                                       \
    do {                                                                                     \
        int nthr_ = am_nthreads(n, nt);                                                      \
        (void)nthr_;                                                                         \
        _Pragma("omp parallel num_threads(nthr_) if (nthr_ > 1)") {                          \
            AM_THREAD_ID(tid, T)                                                             \
            int64_t lo, hi;                                                                  \
            am_range(n, tid, T, &lo, &hi);                                                   \
            __VA_ARGS__                                                                      \
        }                                                                                    \
    } while (0)

/* ------------------------------------------------------------------ rule tapes */

/* A beta rule of amopt/_rule.py recorded by amopt/_tape.py: instruction i sets register
   i from registers a, b, c (or input a, or the constant k). The operation codes are
   amopt._tape.OPS, in order. Every operation rounds once, in double, as NumPy does when
   it runs the rule on float64 sums; the kernels hold no rule of their own. */
typedef struct {
    int32_t op, a, b, c;
    double k;
} am_insn;

enum {
    AM_OP_IN, AM_OP_CONST, AM_OP_ADD, AM_OP_SUB, AM_OP_MUL, AM_OP_DIV, AM_OP_LE, AM_OP_GE,
    AM_OP_LT, AM_OP_GT, AM_OP_EQ, AM_OP_NE, AM_OP_WHERE, AM_OP_ISNAN, AM_OP_MAXIMUM,
    AM_OP_MINIMUM, AM_OP_NEG
};

#define AM_MAX_TAPE 256

/* NumPy's maximum / minimum: a NaN operand gives NaN. */
static inline double am_maximum(double a, double b) {
    return a != a ? a : (b != b ? b : (a >= b ? a : b));
}
static inline double am_minimum(double a, double b) {
    return a != a ? a : (b != b ? b : (a <= b ? a : b));
}

/* Runs the tape on one scope's sums `in`; the registers end in r. Returns 0, or -1 for
   a malformed tape (an unknown operation or a register not yet set). */
static int am_run_tape(const am_insn *code, int64_t n, const double *in, int64_t n_in,
                       double *r) {
    if (n < 0 || n > AM_MAX_TAPE) return -1;
    for (int64_t i = 0; i < n; i++) {
        const am_insn q = code[i];
        if (q.op == AM_OP_IN) {
            if (q.a < 0 || q.a >= n_in) return -1;
            r[i] = in[q.a];
            continue;
        }
        if (q.op == AM_OP_CONST) {
            r[i] = q.k;
            continue;
        }
        if (q.a < 0 || q.a >= i || q.b < 0 || q.b >= i || q.c < 0 || q.c >= i) return -1;
        const double a = r[q.a], b = r[q.b];
        switch (q.op) {
        case AM_OP_ADD: r[i] = a + b; break;
        case AM_OP_SUB: r[i] = a - b; break;
        case AM_OP_MUL: r[i] = a * b; break;
        case AM_OP_DIV: r[i] = a / b; break;
        case AM_OP_LE: r[i] = a <= b; break;
        case AM_OP_GE: r[i] = a >= b; break;
        case AM_OP_LT: r[i] = a < b; break;
        case AM_OP_GT: r[i] = a > b; break;
        case AM_OP_EQ: r[i] = a == b; break;
        case AM_OP_NE: r[i] = a != b; break;
        case AM_OP_WHERE: r[i] = a != 0.0 ? b : r[q.c]; break;
        case AM_OP_ISNAN: r[i] = a != a; break;
        case AM_OP_MAXIMUM: r[i] = am_maximum(a, b); break;
        case AM_OP_MINIMUM: r[i] = am_minimum(a, b); break;
        case AM_OP_NEG: r[i] = -a; break;
        default: return -1;
        }
    }
    return 0;
}

/* 0 when the tape runs on n_in (at most 8) inputs and its outputs are registers of it
   (checked before a step touches any tensor), else -1. */
static inline int am_check_tape(const am_insn *code, int64_t ncode, const int64_t *outs,
                                int64_t nouts, int64_t n_in) {
    double zero[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, r[AM_MAX_TAPE];
    if (n_in < 0 || n_in > 8) return -1;
    if (am_run_tape(code, ncode, zero, n_in, r)) return -1;
    for (int64_t o = 0; o < nouts; o++)
        if (outs[o] < 0 || outs[o] >= ncode) return -1;
    return 0;
}

#endif /* AM_FUSED_COMMON_H */
