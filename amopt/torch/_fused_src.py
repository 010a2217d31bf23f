"""C source of the fused CPU kernels of ``amopt.torch`` (compiled on first use by ``_fused``).

Each optimizer step is two passes over memory per beta scope, the floor for a
rule whose update needs a reduction over the whole scope first:

1. *reduce*: read ``g, d, x`` (and update ``v`` for AM-AdamW) and accumulate
   the inner products of the beta rule;
2. *update*: read ``g, d, x, v`` again and write ``d`` and ``x``.

Both passes stream through blocks of ``AM_BLOCK`` elements with software
prefetching. With per-layer scopes the two passes of a tensor run back to back,
so the second one finds much of the tensor still in the last-level cache; with
a global scope pass 2 takes the tensors, and chunks of ``AM_CHUNK`` elements
within each, from the last to the first for the same reason. OpenMP threads
split each tensor into contiguous ranges (tensors of at least ``AM_PAR_MIN``
elements).

The arithmetic is that of the single-tensor reference paths
(``_single_tensor_amsgd`` / ``_single_tensor_am_adamw``) up to float rounding:
elementwise values are formed in the parameter dtype as there, with rewrites
that trade divisions for multiplications (``v / bias2`` as ``v * (1 / bias2)``;
``1/p``, ``1/(1 + lam p)`` and ``(beta + lam p)/(1 + lam p)`` from the single
reciprocal ``w = 1 / (p (1 + lam p))``; ``w (d^2 + g^2)`` for
``w d^2 + w g^2``), and with fused multiply-adds where the compiler finds
them. Each block's sums are accumulated in the parameter dtype (vector lanes,
256 elements), and the block sums are added in double precision with Neumaier
compensation, in a fixed order (deterministic for a given number of threads):
at least as accurate as ``torch.sum``. The beta rule itself (guard, clip,
variants, bias-correction product) is evaluated in the accumulation dtype
exactly as ``amopt.torch._common.guarded_beta``.

The source is written once with the placeholders ``TYPE``, ``SUF`` and ``SQRT``
and instantiated for ``float`` (``f32``) and ``double`` (``f64``).
"""

from __future__ import annotations

__all__ = ["source"]

_COMMON = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define AM_BLOCK 256
#define AM_PAR_MIN 65536
#define AM_MAX_SUMS 3
#define AM_MAX_THREADS 256
#define AM_INLINE static inline __attribute__((always_inline))
#ifndef AM_PF_BYTES
#define AM_PF_BYTES 1024
#endif
/* software prefetch of the block AM_PF_BYTES ahead of [b0, b1) in each stream */
#define AM_PREFETCH_BLOCK(b0, b1, hi, s1, s2, s3, s4, use4)                              \
    do {                                                                                  \
        const int64_t pf_ = AM_PF_BYTES / (int64_t)sizeof(*(s1));                         \
        const int64_t step_ = 64 / (int64_t)sizeof(*(s1));                                \
        int64_t e_ = (b1) + pf_ < (hi) ? (b1) + pf_ : (hi);                               \
        for (int64_t q_ = (b0) + pf_; q_ < e_; q_ += step_) {                             \
            __builtin_prefetch(&(s1)[q_], 0, 3);                                          \
            __builtin_prefetch(&(s2)[q_], 0, 3);                                          \
            __builtin_prefetch(&(s3)[q_], 0, 3);                                          \
            if (use4) __builtin_prefetch(&(s4)[q_], 0, 3);                                \
        }                                                                                 \
    } while (0)

/* Pass 2 walks a range in chunks of AM_CHUNK elements taken from the end: the chunks
   pass 1 read last are still in the (last-level) cache. Each chunk is walked forwards,
   the direction the hardware prefetchers follow best. */
#define AM_CHUNK 262144
#define AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)                                               \
    for (int64_t c1 = (hi); c1 > (lo); c1 -= AM_CHUNK) {                                  \
        int64_t c0 = c1 - AM_CHUNK > (lo) ? c1 - AM_CHUNK : (lo);
#define AM_CHUNKS_END }

typedef struct { double s, c; } am_sum;

static inline void am_add(am_sum *a, double x) {
    double t = a->s + x;
    if (isfinite(t)) {
        if (fabs(a->s) >= fabs(x)) a->c += (a->s - t) + x;
        else a->c += (x - t) + a->s;
    }
    a->s = t;
}

static inline double am_value(const am_sum *a) {
    return isfinite(a->s) ? a->s + a->c : a->s;
}

static inline int am_nthreads(int64_t n, int64_t requested) {
    if (requested > AM_MAX_THREADS) requested = AM_MAX_THREADS;
    return (requested > 1 && n >= AM_PAR_MIN) ? (int)requested : 1;
}


static inline void am_range(int64_t n, int tid, int nthr, int64_t *lo, int64_t *hi) {
    /* contiguous, cache-line aligned chunks, the same for every pass of a tensor */
    int64_t a = (n * tid) / nthr, b = (n * (tid + 1)) / nthr;
    if (tid > 0) a &= ~(int64_t)15;
    if (tid < nthr - 1) b &= ~(int64_t)15;
    *lo = a; *hi = b;
}

static inline double am_next_step(void *step, int64_t is_double) {
    /* state["step"] += 1, on the CPU counter itself; returns the new value */
    if (is_double) { double *s = (double *)step; *s += 1.0; return *s; }
    float *s = (float *)step; *s += 1.0f; return (double)*s;
}

/* combine per-thread partial sums in thread order */
static void am_combine(am_sum *parts, int nthr, int nsums, double *out) {
    for (int k = 0; k < nsums; k++) {
        am_sum acc = {0.0, 0.0};
        for (int t = 0; t < nthr; t++) am_add(&acc, am_value(&parts[t * AM_MAX_SUMS + k]));
        out[k] = am_value(&acc);
    }
}

int am_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""

_TYPED = r"""
/* ------------------------------------------------------------------ TYPE */

static inline TYPE am_guarded_beta_SUF(TYPE num, TYPE den, TYPE ref, TYPE beta_max, TYPE tiny) {
    /* amopt.torch._common.guarded_beta, in the accumulation dtype */
    int degenerate = den <= tiny * ref;
    TYPE ratio = num / (degenerate ? (TYPE)1 : den);
    if (isnan(ratio)) ratio = (TYPE)0;
    TYPE beta = ratio < (TYPE)0 ? (TYPE)0 : ratio;
    if (beta > beta_max) beta = beta_max;
    return degenerate ? (TYPE)0 : beta;
}

static inline TYPE am_variant_SUF(TYPE beta, int64_t variant, const double *hp) {
    /* hp: beta_min, theta, beta_high, beta_low */
    if (variant == 1) return beta < (TYPE)hp[0] ? (TYPE)hp[0] : beta;
    if (variant == 2) return beta >= (TYPE)hp[1] ? (TYPE)hp[2] : (TYPE)hp[3];
    return beta;
}

/* per-tensor constants of AM-AdamW, in the parameter dtype */
typedef struct {
    TYPE beta2, one_m_beta2, eps, lam, wd, lr, a1, a2, sgn, l2, decay, shrink, ib2, c;
} am_adamw_k_SUF;

/* ---- AM-AdamW, pass 1 over [lo, hi): v update and the sums N, D, R ----
   Per element, with u = 1/(1 + lam p), w = u/p, r = 1/p = w (1 + lam p), lam u = lam p w:
     N: g^2/p - lam u (d-g)^2 + wd lr g d/p + wd (2 + wd lr) g x - wd d x
      = r g (g + wd lr d) - lam p [w (d-g)^2] + x (wd (2 + wd lr) g - wd d)
     D: w (d-g)^2          R: w (d^2 + g^2)                                           */
AM_INLINE void adamw_reduce_range_SUF(int64_t lo, int64_t hi, const TYPE *restrict x,
                                      const TYPE *restrict g, const TYPE *restrict d,
                                      TYPE *restrict v, const am_adamw_k_SUF *k, const int neg,
                                      const int has_l2, const int has_wd, am_sum *acc) {
    const TYPE beta2 = k->beta2, omb = k->one_m_beta2, ib2 = k->ib2, eps = k->eps, c = k->c;
    const TYPE lam = k->lam, a1 = k->a1, a2 = k->a2, wd = k->wd, l2 = k->l2;
    for (int64_t b0 = lo; b0 < hi; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < hi ? b0 + AM_BLOCK : hi;
        TYPE bn = 0, bd = 0, br = 0;
        AM_PREFETCH_BLOCK(b0, b1, hi, g, d, v, x, has_wd || has_l2);
#pragma omp simd reduction(+ : bn, bd, br)
        for (int64_t i = b0; i < b1; i++) {
            TYPE gi = g[i], di = d[i];
            if (neg) gi = -gi;
            if (has_l2) gi = gi + l2 * x[i];
            TYPE gg = gi * gi;
            TYPE vn = v[i] * beta2 + omb * gg;
            v[i] = vn;
            TYPE p = (SQRT(vn * ib2) + eps) * c;
            TYPE lp = lam * p;
            TYPE one_lp = (TYPE)1 + lp;
            TYPE w = (TYPE)1 / (p * one_lp);
            TYPE r = w * one_lp;
            TYPE dv = di - gi;
            TYPE e = w * (dv * dv);
            TYPE t;
            if (has_wd) {
                TYPE xi = x[i];
                t = r * (gi * (gi + a1 * di)) - lp * e + xi * (a2 * gi - wd * di);
            } else {
                t = r * gg - lp * e;
            }
            bn += t;
            bd += e;
            br += w * (di * di + gg);
        }
        am_add(&acc[0], (double)bn); am_add(&acc[1], (double)bd); am_add(&acc[2], (double)br);
    }
}

/* ---- AM-AdamW: pass 1 over a tensor, threads over contiguous chunks ---- */
static void adamw_reduce_SUF(int64_t n, const TYPE *x, const TYPE *g, const TYPE *d, TYPE *v,
                             const am_adamw_k_SUF *k, int64_t nt, double *out) {
    int nthr = am_nthreads(n, nt);
    am_sum parts[AM_MAX_SUMS * AM_MAX_THREADS];
    const int neg = k->sgn < (TYPE)0, has_l2 = k->l2 != (TYPE)0, has_wd = k->wd != (TYPE)0;
    int used = 1;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        if (tid == 0) used = T;
        int64_t lo, hi;
        am_range(n, tid, T, &lo, &hi);
        am_sum *acc = &parts[tid * AM_MAX_SUMS];
        for (int j = 0; j < AM_MAX_SUMS; j++) { acc[j].s = 0.0; acc[j].c = 0.0; }
        /* one specialised loop per combination of the flags */
        if (neg) {
            if (has_l2) adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 1, 1, 0, acc);
            else if (has_wd) adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 1, 0, 1, acc);
            else adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 1, 0, 0, acc);
        } else {
            if (has_l2) adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 0, 1, 0, acc);
            else if (has_wd) adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 0, 0, 1, acc);
            else adamw_reduce_range_SUF(lo, hi, x, g, d, v, k, 0, 0, 0, acc);
        }
    }
    am_combine(parts, used, 3, out);
}

/* ---- AM-AdamW: pass 2, d and x ---- */
AM_INLINE void adamw_update_range_SUF(int64_t lo, int64_t hi, TYPE *restrict x,
                                      const TYPE *restrict g, TYPE *restrict d,
                                      const TYPE *restrict v, const am_adamw_k_SUF *k,
                                      TYPE beta, const int neg, const int has_l2,
                                      const int mode, const int has_wd) {
    const TYPE mlr = -k->lr, decay = k->decay, shrink = k->shrink, lam = k->lam;
    const TYPE ib2 = k->ib2, eps = k->eps, c = k->c, l2 = k->l2;
    AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)
    for (int64_t b0 = c0; b0 < c1; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < c1 ? b0 + AM_BLOCK : c1;
        AM_PREFETCH_BLOCK(b0, b1, c1, g, d, v, x, 1);
#pragma omp simd
        for (int64_t i = b0; i < b1; i++) {
            TYPE gi = g[i], xi = x[i];
            if (neg) gi = -gi;
            if (has_l2) gi = gi + l2 * xi;
            TYPE p = (SQRT(v[i] * ib2) + eps) * c;
            TYPE lp = lam * p;
            TYPE one_lp = (TYPE)1 + lp;
            TYPE w = (TYPE)1 / (p * one_lp);
            TYPE coef = (beta + lp) * (p * w);     /* (beta + lam p) / (1 + lam p) */
            TYPE dn = (d[i] - gi) * coef + gi;
            d[i] = dn;
            TYPE step = dn * (one_lp * w);         /* d / p */
            if (mode == 1) {
                xi = xi + mlr * step;
                if (has_wd) xi = xi * shrink;
            } else {
                if (has_wd) xi = xi * decay;
                xi = xi + mlr * step;
            }
            x[i] = xi;
        }
    }
    AM_CHUNKS_END
}

static void adamw_update_SUF(int64_t n, TYPE *x, const TYPE *g, TYPE *d, const TYPE *v,
                             const am_adamw_k_SUF *k, TYPE beta, int64_t mode, int64_t nt) {
    int nthr = am_nthreads(n, nt);
    const int neg = k->sgn < (TYPE)0, has_l2 = k->l2 != (TYPE)0;
    const int has_wd = mode == 1 ? k->shrink != (TYPE)1 : k->decay != (TYPE)1;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        int64_t lo, hi;
        am_range(n, tid, T, &lo, &hi);
        if (mode == 1) {
            if (neg) adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 1, 0, 1, has_wd);
            else adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 0, 0, 1, has_wd);
        } else if (has_l2) {
            if (neg) adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 1, 1, 0, 0);
            else adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 0, 1, 0, 0);
        } else if (has_wd) {
            if (neg) adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 1, 0, 0, 1);
            else adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 0, 0, 0, 1);
        } else {
            if (neg) adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 1, 0, 0, 0);
            else adamw_update_range_SUF(lo, hi, x, g, d, v, k, beta, 0, 0, 0, 0);
        }
    }
}

/* hp: lr, beta1, beta2, eps, wd, lam, beta_min, theta, beta_high, beta_low
   flags: per_layer, mode (0 decoupled, 1 proximal, 2 l2), maximize, variant, threads,
          steps_are_double */
int am_adamw_SUF(int64_t count, const int64_t *numel, void **xs, void **gs, void **ds,
                 void **vs, void **steps, void **prods_in, TYPE *betas_out,
                 TYPE *prods_out, const double *hp, const int64_t *flags) {
    const int64_t per_layer = flags[0], mode = flags[1], maximize = flags[2];
    const int64_t variant = flags[3], nt = flags[4], steps_double = flags[5];
    const double lr = hp[0], beta1 = hp[1], beta2 = hp[2], eps = hp[3], lam = hp[5];
    const double wd = mode == 2 ? 0.0 : hp[4];
    const TYPE tiny = (TYPE)(sizeof(TYPE) == 4 ? 1.4210854715202004e-14 : 4.930380657631324e-32);
    const TYPE bmax = (TYPE)beta1;
    am_adamw_k_SUF base;
    base.beta2 = (TYPE)beta2; base.one_m_beta2 = (TYPE)(1.0 - beta2);
    base.eps = (TYPE)eps; base.lam = (TYPE)lam; base.wd = (TYPE)wd; base.lr = (TYPE)lr;
    base.a1 = (TYPE)wd * (TYPE)lr;
    base.a2 = (TYPE)wd * ((TYPE)2.0 + (TYPE)wd * (TYPE)lr);
    base.sgn = maximize ? (TYPE)-1 : (TYPE)1;
    base.l2 = mode == 2 ? (TYPE)hp[4] : (TYPE)0;
    base.decay = mode == 0 ? (TYPE)(1.0 - lr * wd) : (TYPE)1;
    base.shrink = mode == 1 ? (TYPE)(1.0 / (1.0 + lr * wd)) : (TYPE)1;
    size_t nk = (size_t)(count > 0 ? count : 1);
    am_adamw_k_SUF *ks = (am_adamw_k_SUF *)malloc(sizeof(am_adamw_k_SUF) * nk);
    if (!ks) return 1;
    double sums[3];
    am_sum acc[3] = {{0, 0}, {0, 0}, {0, 0}};
    TYPE prod = per_layer ? (TYPE)0 : *(TYPE *)prods_in[0];
    for (int64_t j = 0; j < count; j++) {
        double s = am_next_step(steps[j], steps_double);
        ks[j] = base;
        ks[j].ib2 = (TYPE)(1.0 / (1.0 - pow(beta2, s)));
        if (per_layer) prod = *(TYPE *)prods_in[j];
        ks[j].c = (TYPE)1 - (TYPE)beta1 * prod;
        adamw_reduce_SUF(numel[j], (TYPE *)xs[j], (TYPE *)gs[j], (TYPE *)ds[j], (TYPE *)vs[j],
                         &ks[j], nt, sums);
        if (per_layer) {
            TYPE beta = am_guarded_beta_SUF((TYPE)sums[0], (TYPE)sums[1], (TYPE)sums[2],
                                            bmax, tiny);
            beta = am_variant_SUF(beta, variant, hp + 6);
            betas_out[j] = beta;
            prods_out[j] = prod * beta;
            adamw_update_SUF(numel[j], (TYPE *)xs[j], (TYPE *)gs[j], (TYPE *)ds[j],
                             (TYPE *)vs[j], &ks[j], beta, mode, nt);
        } else {
            for (int q = 0; q < 3; q++) am_add(&acc[q], sums[q]);
        }
    }
    if (!per_layer && count > 0) {
        TYPE beta = am_guarded_beta_SUF((TYPE)am_value(&acc[0]), (TYPE)am_value(&acc[1]),
                                        (TYPE)am_value(&acc[2]), bmax, tiny);
        beta = am_variant_SUF(beta, variant, hp + 6);
        betas_out[0] = beta;
        prods_out[0] = prod * beta;
        for (int64_t j = count - 1; j >= 0; j--)  /* the last tensors are in cache */
            adamw_update_SUF(numel[j], (TYPE *)xs[j], (TYPE *)gs[j], (TYPE *)ds[j],
                             (TYPE *)vs[j], &ks[j], beta, mode, nt);
    }
    free(ks);
    return 0;
}

/* ---- AM-MSGD (AMSGD): pass 1 over [lo, hi), <g,g>, <d,d>, <d-g,d-g> ---- */
AM_INLINE void sgd_reduce_range_SUF(int64_t lo, int64_t hi, const TYPE *restrict x,
                                    const TYPE *restrict g, const TYPE *restrict d, TYPE wd,
                                    const int neg, const int has_wd, am_sum *acc) {
    for (int64_t b0 = lo; b0 < hi; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < hi ? b0 + AM_BLOCK : hi;
        TYPE bg = 0, bd = 0, bv = 0;
        AM_PREFETCH_BLOCK(b0, b1, hi, g, d, x, x, has_wd);
#pragma omp simd reduction(+ : bg, bd, bv)
        for (int64_t i = b0; i < b1; i++) {
            TYPE gi = g[i], di = d[i];
            if (neg) gi = -gi;
            if (has_wd) gi = gi + wd * x[i];
            TYPE dv = di - gi;
            bg += gi * gi;
            bd += di * di;
            bv += dv * dv;
        }
        am_add(&acc[0], (double)bg); am_add(&acc[1], (double)bd); am_add(&acc[2], (double)bv);
    }
}

static void sgd_reduce_SUF(int64_t n, const TYPE *x, const TYPE *g, const TYPE *d, TYPE sgn,
                           TYPE wd, int64_t nt, double *out) {
    int nthr = am_nthreads(n, nt);
    am_sum parts[AM_MAX_SUMS * AM_MAX_THREADS];
    const int neg = sgn < (TYPE)0, has_wd = wd != (TYPE)0;
    int used = 1;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        if (tid == 0) used = T;
        int64_t lo, hi;
        am_range(n, tid, T, &lo, &hi);
        am_sum *acc = &parts[tid * AM_MAX_SUMS];
        for (int j = 0; j < AM_MAX_SUMS; j++) { acc[j].s = 0.0; acc[j].c = 0.0; }
        if (neg) {
            if (has_wd) sgd_reduce_range_SUF(lo, hi, x, g, d, wd, 1, 1, acc);
            else sgd_reduce_range_SUF(lo, hi, x, g, d, wd, 1, 0, acc);
        } else {
            if (has_wd) sgd_reduce_range_SUF(lo, hi, x, g, d, wd, 0, 1, acc);
            else sgd_reduce_range_SUF(lo, hi, x, g, d, wd, 0, 0, acc);
        }
    }
    am_combine(parts, used, 3, out);
}

/* ---- AMSGD: pass 2, d = g + gamma (d - g), x -= lr d ---- */
AM_INLINE void sgd_update_range_SUF(int64_t lo, int64_t hi, TYPE *restrict x,
                                    const TYPE *restrict g, TYPE *restrict d, TYPE gamma,
                                    TYPE mlr, TYPE wd, const int neg, const int has_wd) {
    AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)
    for (int64_t b0 = c0; b0 < c1; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < c1 ? b0 + AM_BLOCK : c1;
        AM_PREFETCH_BLOCK(b0, b1, c1, g, d, x, x, 0);
#pragma omp simd
        for (int64_t i = b0; i < b1; i++) {
            TYPE gi = g[i], xi = x[i];
            if (neg) gi = -gi;
            if (has_wd) gi = gi + wd * xi;
            TYPE dn = (d[i] - gi) * gamma + gi;
            d[i] = dn;
            x[i] = xi + mlr * dn;
        }
    }
    AM_CHUNKS_END
}

static void sgd_update_SUF(int64_t n, TYPE *x, const TYPE *g, TYPE *d, TYPE gamma, TYPE lr,
                           TYPE sgn, TYPE wd, int64_t nt) {
    int nthr = am_nthreads(n, nt);
    const int neg = sgn < (TYPE)0, has_wd = wd != (TYPE)0;
    const TYPE mlr = -lr;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        int64_t lo, hi;
        am_range(n, tid, T, &lo, &hi);
        if (neg) {
            if (has_wd) sgd_update_range_SUF(lo, hi, x, g, d, gamma, mlr, wd, 1, 1);
            else sgd_update_range_SUF(lo, hi, x, g, d, gamma, mlr, wd, 1, 0);
        } else {
            if (has_wd) sgd_update_range_SUF(lo, hi, x, g, d, gamma, mlr, wd, 0, 1);
            else sgd_update_range_SUF(lo, hi, x, g, d, gamma, mlr, wd, 0, 0);
        }
    }
}

/* hp: lr, lam, beta_max, wd, beta_min, theta, beta_high, beta_low
   flags: per_layer, maximize, variant, threads, steps_are_double */
int am_sgd_SUF(int64_t count, const int64_t *numel, void **xs, void **gs, void **ds,
               void **steps, TYPE *betas_out, const double *hp, const int64_t *flags) {
    const int64_t per_layer = flags[0], maximize = flags[1], variant = flags[2];
    const int64_t nt = flags[3], steps_double = flags[4];
    const double lr = hp[0], lam = hp[1];
    const TYPE sgn = maximize ? (TYPE)-1 : (TYPE)1, wd = (TYPE)hp[3];
    const TYPE tiny = (TYPE)(sizeof(TYPE) == 4 ? 1.4210854715202004e-14 : 4.930380657631324e-32);
    const TYPE one_lam = (TYPE)(1.0 + lam);
    double sums[3];
    am_sum acc[3] = {{0, 0}, {0, 0}, {0, 0}};
    for (int64_t k = 0; k < count; k++) {
        am_next_step(steps[k], steps_double);
        sgd_reduce_SUF(numel[k], (TYPE *)xs[k], (TYPE *)gs[k], (TYPE *)ds[k], sgn, wd, nt, sums);
        if (per_layer) {
            TYPE gg = (TYPE)sums[0], dd = (TYPE)sums[1], vv = (TYPE)sums[2];
            TYPE num = one_lam * gg - (TYPE)lam * vv;
            TYPE beta = am_guarded_beta_SUF(num, vv, dd + gg, (TYPE)hp[2], tiny);
            beta = am_variant_SUF(beta, variant, hp + 4);
            betas_out[k] = beta;
            TYPE gamma = (beta + (TYPE)lam) / one_lam;
            sgd_update_SUF(numel[k], (TYPE *)xs[k], (TYPE *)gs[k], (TYPE *)ds[k], gamma,
                           (TYPE)lr, sgn, wd, nt);
        } else {
            for (int j = 0; j < 3; j++) am_add(&acc[j], sums[j]);
        }
    }
    if (!per_layer && count > 0) {
        TYPE gg = (TYPE)am_value(&acc[0]), dd = (TYPE)am_value(&acc[1]);
        TYPE vv = (TYPE)am_value(&acc[2]);
        TYPE num = one_lam * gg - (TYPE)lam * vv;
        TYPE beta = am_guarded_beta_SUF(num, vv, dd + gg, (TYPE)hp[2], tiny);
        beta = am_variant_SUF(beta, variant, hp + 4);
        betas_out[0] = beta;
        TYPE gamma = (beta + (TYPE)lam) / one_lam;
        for (int64_t k = count - 1; k >= 0; k--)  /* the last tensors are in cache */
            sgd_update_SUF(numel[k], (TYPE *)xs[k], (TYPE *)gs[k], (TYPE *)ds[k], gamma,
                           (TYPE)lr, sgn, wd, nt);
    }
    return 0;
}
"""


def source() -> str:
    """The complete C translation unit: shared helpers, then the float and double kernels."""
    typed = [
        _TYPED.replace("TYPE", ctype).replace("SUF", suffix).replace("SQRT", sqrt)
        for ctype, suffix, sqrt in (("float", "f32", "sqrtf"), ("double", "f64", "sqrt"))
    ]
    return _COMMON + "".join(typed)
