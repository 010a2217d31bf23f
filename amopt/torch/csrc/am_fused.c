/* Fused CPU kernels of amopt.torch: the REDUCE and APPLY stages of AMSGD and AM-Adam(W).
 *
 * Every AM step is reduce -> rule -> apply (docs/algorithms.md). The kernels here only
 * reduce (form the per-tensor sums the rule needs) and apply (update the momentum and the
 * parameters given the coefficient the rule returned); the beta rule itself lives once, in
 * amopt/_rule.py, and runs between the two calls (amopt/torch/_fused.py drives them).
 *
 * Exported functions (TYPE float: suffix f32, double: f64; ISA: base, avx2, avx512):
 *
 *   am_sgd_reduce_<T>_<ISA>    sums [vv, gg, dd] of each tensor, v = d - g
 *   am_sgd_apply_<T>_<ISA>     d = g + gamma (d - g), x -= lr d
 *   am_adam_reduce_<T>_<ISA>   v = beta2 v + (1 - beta2) g^2 (in place) and the sums
 *                              [N, D, ref] of each tensor
 *   am_adam_apply_<T>_<ISA>    d = g + (beta + lam p) / (1 + lam p) (d - g), then x
 *   am_sgd_step_<T>_<ISA>      reduce -> rule -> apply per chunk, the rule as a tape of
 *   am_adam_step_<T>_<ISA>     amopt/_tape.py (chunks still in cache when applied)
 *   am_adam_traffic_<T>_<ISA>  adam_step's memory traffic without its arithmetic (bench)
 *   am_advance_steps           step counters += 1 (and Adam's 1 / (1 - beta2^step))
 *   am_tape_eval, am_cpu_level, am_isa_built, am_openmp, am_abi_version, am_source_hash
 *
 * The three ISA variants come from one source compiled three times in this translation
 * unit under different target options (am_fused_variant.h, included once per variant);
 * the caller picks one at load time from am_cpu_level() (__builtin_cpu_supports), so a
 * library built on one machine runs on any x86-64 CPU.
 */

#include "am_fused_common.h"

#define AM_ISA base
/* fma() is one instruction where math.h says so (e.g. AArch64), a library call otherwise */
#if defined(FP_FAST_FMAF) && defined(FP_FAST_FMA)
#define AM_HAS_FMA 1
#else
#define AM_HAS_FMA 0
#endif
#define AM_LANES 4
#include "am_fused_variant.h"

#if AM_X86_SIMD

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define AM_TARGETED
#define AM_HAS_FMA 1
#define AM_LANES 8
#define AM_ISA avx2
#include "am_fused_variant.h"

#if defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl"),                   \
                   min_vector_width(512))),                                                 \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#endif
#define AM_TARGETED
#define AM_HAS_FMA 1
#define AM_LANES 16
#define AM_ISA avx512
#include "am_fused_variant.h"

#endif /* AM_X86_SIMD */

/* ------------------------------------------------------------------ rule tapes */

/* Runs a rule tape on `rows` scopes of n_in sums each; out[row * nouts + o] is output o
   (register outs[o]). The kernels' own evaluation, exported for the tests. */
AM_EXPORT int am_tape_eval(const am_insn *code, int64_t ncode, const double *in, int64_t rows,
                           int64_t n_in, const int64_t *outs, int64_t nouts, double *out) {
    double r[AM_MAX_TAPE];
    if (am_check_tape(code, ncode, outs, nouts, n_in)) return -1;
    for (int64_t j = 0; j < rows; j++) {
        if (am_run_tape(code, ncode, in + j * n_in, n_in, r)) return -1;
        for (int64_t o = 0; o < nouts; o++) out[j * nouts + o] = r[outs[o]];
    }
    return 0;
}

/* ------------------------------------------------------------------ step counters */

/* Adds 1 to each step counter, a 0-d float (is_double[j] == 0) or double tensor at
   steps[j], as torch._foreach_add_(steps, 1) does; with ib2 not NULL also sets Adam's
   second-moment correction ib2[j] = 1 / (1 - beta2^step_j), in double. One call instead
   of a dispatch per counter. */
AM_EXPORT int am_advance_steps(int64_t count, void *const *steps, const uint8_t *is_double,
                               double beta2, double *ib2) {
    for (int64_t j = 0; j < count; j++) {
        double s;
        if (is_double[j]) {
            double *p = (double *)steps[j];
            s = *p = *p + 1.0;
        } else {
            float *p = (float *)steps[j];
            s = *p = *p + 1.0f;
        }
        if (ib2) ib2[j] = 1.0 / (1.0 - pow(beta2, s));
    }
    return 0;
}

/* ------------------------------------------------------------------ queries */

/* The best variant this CPU (and its operating system) can run: 2 AVX-512, 1 AVX2+FMA,
   0 the x86-64 (or other architecture's) baseline. */
AM_EXPORT int am_cpu_level(void) {
#if AM_X86_SIMD
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vl");
    return avx512 ? 2 : (avx2 ? 1 : 0);
#else
    return 0;
#endif
}

/* Bit k set: the variant of level k is in this library. */
AM_EXPORT int am_isa_built(void) {
#if AM_X86_SIMD
    return 7;
#else
    return 1;
#endif
}

AM_EXPORT int am_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* Bumped whenever an exported signature changes; the loader refuses another value. */
AM_EXPORT int am_abi_version(void) { return AM_ABI_VERSION; }

/* SHA-256 of the sources this library was built from (set by the build); the loader
   refuses a library whose sources are not the ones installed next to it. */
#ifndef AM_SOURCE_HASH
#define AM_SOURCE_HASH ""
#endif
AM_EXPORT const char *am_source_hash(void) { return AM_SOURCE_HASH; }
