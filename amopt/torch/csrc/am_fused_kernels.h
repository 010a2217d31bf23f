/* The reduce and apply kernels, instantiated by am_fused.c once per (ISA, dtype):
 * AM_ISA names the variant (base, avx2, avx512) and AM_DOUBLE picks the dtype.
 * No include guard: this file is meant to be included several times.
 *
 * Arithmetic: elementwise values are formed in the parameter dtype, as in the
 * single-tensor reference paths, with rewrites that trade divisions for
 * multiplications: p = c (eps + sqrt(v / bias2)) as sqrt(v) (c sqrt(1/bias2)) + c eps;
 * 1/p, u = 1/(1 + lam p) and (beta + lam p)/(1 + lam p) from the single reciprocal
 * w = 1 / (p (1 + lam p)); squares formed before they are weighted. The library is
 * compiled without floating-point contraction (-ffp-contract=off): every fused
 * multiply-add is written out (AM_FMA), so each value rounds as the source says, in
 * every loop and with every compiler, and the products that feed several sums (g^2)
 * are rounded once and added, which leaves the multiply pipes less to do (the divider
 * and the multiply-adds share them on AMD Zen 3). Every quantity that is linear in
 * s = sqrt(v) (p, 1 + lam p, and p (1 + lam p) = lam cs^2 v + cs (1 + 2 lam ce) s
 * + ce (1 + lam ce)) is one multiply-add of s with per-tensor constants, and w is
 * applied last: the chain from v to w to the results is short, which matters on CPUs
 * whose out-of-order window fills while the square root and the division are in
 * flight (measured on AMD Zen 3). Each block of AM_BLOCK elements is
 * summed in the parameter dtype (the numerator as three weighted partial sums,
 * combined in double) and the block sums are added in double precision with
 * compensation (am_add). A float block whose sums leave float's safe range (AM_UNSAFE:
 * overflow, or sums small enough for subnormal squares, e.g. of gradients below about
 * 1e-19, to matter) is summed again in double, so that beta does not depend on the
 * scale of the gradients.
 *
 * The gradient enters every kernel as g * gmul, gmul = (maximize ? -1 : 1) / grad_scale,
 * exact for the power-of-two scales of torch.amp.GradScaler.
 */

#if AM_DOUBLE
#define TYPE double
#define SUF f64
#define SQRT sqrt
#define FMA_ fma
#else
#define TYPE float
#define SUF f32
#define SQRT sqrtf
#define FMA_ fmaf
#endif
/* a b + c, rounded once where the variant has the instruction */
#if AM_HAS_FMA
#define AM_FMA(a, b, c) FMA_(a, b, c)
#else
#define AM_FMA(a, b, c) ((a) * (b) + (c))
#endif

#define AM_FN_(name, suf, isa) am_##name##_##suf##_##isa
#define AM_FN2(name, suf, isa) AM_FN_(name, suf, isa)
#define AM_FN(name) AM_FN2(name, SUF, AM_ISA)

/* ================================================================== AMSGD */

/* The AMSGD reduce terms of element i, in dtype T: g (gmul, coupled decay), d (= g on
   the first step), v = d - g, added to sv, sg, sd. Products rounded to T, then added
   (AM_FMA is for the parameter dtype only). */
#define AM_SGD_TERMS(T, i, sv, sg, sd)                                                      \
    T gi = (T)g[i] * (T)gmul;                                                                \
    if (has_wd) gi = gi + (T)wd * (T)x[i];                                                   \
    T di = first ? gi : (T)d[i];                                                             \
    T dv = di - gi;                                                                          \
    sv += dv * dv;                                                                           \
    sg += gi * gi;                                                                           \
    sd += di * di;

/* reduce over [lo, hi): <v,v>, <g,g>, <d,d> with v = d - g (first: d = g). */
AM_INLINE void AM_FN(sgd_reduce_range)(int64_t lo, int64_t hi, const TYPE *restrict x,
                                       const TYPE *restrict g, const TYPE *restrict d,
                                       const TYPE gmul, const TYPE wd, const int has_wd,
                                       const int first, am_sum *acc) {
    for (int64_t b0 = lo; b0 < hi; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < hi ? b0 + AM_BLOCK : hi;
        TYPE bv = 0, bg = 0, bd = 0;
#pragma omp simd reduction(+ : bv, bg, bd)
        for (int64_t i = b0; i < b1; i++) {
            AM_SGD_TERMS(TYPE, i, bv, bg, bd)
        }
#if !AM_DOUBLE
        if (AM_UNSAFE(bv + bg + bd, AM_SAFE_MIN, b0, b1, g, first ? NULL : d)) {
            double wv = 0, wg = 0, wdd = 0;
            for (int64_t i = b0; i < b1; i++) {
                AM_SGD_TERMS(double, i, wv, wg, wdd)
            }
            am_add(&acc[0], wv);
            am_add(&acc[1], wg);
            am_add(&acc[2], wdd);
            continue;
        }
#endif
        am_add(&acc[0], (double)bv);
        am_add(&acc[1], (double)bg);
        am_add(&acc[2], (double)bd);
    }
}

static void AM_FN(sgd_reduce_one)(int64_t n, const TYPE *x, const TYPE *g, const TYPE *d,
                                  TYPE gmul, TYPE wd, int first, int64_t nt, double *out) {
    const int has_wd = wd != (TYPE)0;
    /* one specialised loop per combination of the flags */
    AM_PARALLEL_REDUCE(n, nt, 3, out, {
        if (first) {
            if (has_wd) AM_FN(sgd_reduce_range)(lo, hi, x, g, d, gmul, wd, 1, 1, acc);
            else AM_FN(sgd_reduce_range)(lo, hi, x, g, d, gmul, wd, 0, 1, acc);
        } else {
            if (has_wd) AM_FN(sgd_reduce_range)(lo, hi, x, g, d, gmul, wd, 1, 0, acc);
            else AM_FN(sgd_reduce_range)(lo, hi, x, g, d, gmul, wd, 0, 0, acc);
        }
    });
}

/* hp: gmul, wd, lr. first[j] != 0: d_j is not initialised yet (step 0, d = g).
   sums: count x 3 doubles, [vv, gg, dd] of each tensor. */
AM_EXPORT int AM_FN(sgd_reduce)(int64_t count, const int64_t *numel, void *const *xs,
                                void *const *gs, void *const *ds, const uint8_t *first,
                                const double *hp, int64_t nthreads, double *sums) {
    const TYPE gmul = (TYPE)hp[0], wd = (TYPE)hp[1];
    for (int64_t j = 0; j < count; j++)
        AM_FN(sgd_reduce_one)(numel[j], (const TYPE *)xs[j], (const TYPE *)gs[j],
                              (const TYPE *)ds[j], gmul, wd, first[j] != 0, nthreads,
                              sums + 3 * j);
    return 0;
}

/* apply over [lo, hi): d = g + gamma (d - g) (d = g when first), x -= lr d. */
AM_INLINE void AM_FN(sgd_apply_range)(int64_t lo, int64_t hi, TYPE *restrict x,
                                      const TYPE *restrict g, TYPE *restrict d,
                                      const TYPE gamma, const TYPE mlr, const TYPE gmul,
                                      const TYPE wd, const int has_wd, const int first) {
    AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
        TYPE gi = g[i] * gmul, xi = x[i];
        if (has_wd) gi = AM_FMA(wd, xi, gi);
        TYPE dn = first ? gi : AM_FMA(d[i] - gi, gamma, gi);
        d[i] = dn;
        x[i] = AM_FMA(mlr, dn, xi);
    }
    AM_CHUNKS_END
}

static void AM_FN(sgd_apply_one)(int64_t n, TYPE *x, const TYPE *g, TYPE *d, TYPE gamma,
                                 TYPE mlr, TYPE gmul, TYPE wd, int first, int64_t nt) {
    const int has_wd = wd != (TYPE)0;
    AM_PARALLEL_APPLY(n, nt, {
        if (first) {
            if (has_wd) AM_FN(sgd_apply_range)(lo, hi, x, g, d, gamma, mlr, gmul, wd, 1, 1);
            else AM_FN(sgd_apply_range)(lo, hi, x, g, d, gamma, mlr, gmul, wd, 0, 1);
        } else {
            if (has_wd) AM_FN(sgd_apply_range)(lo, hi, x, g, d, gamma, mlr, gmul, wd, 1, 0);
            else AM_FN(sgd_apply_range)(lo, hi, x, g, d, gamma, mlr, gmul, wd, 0, 0);
        }
    });
}

/* gamma[j * gamma_stride] is the coefficient of tensor j (stride 0: one for all).
   The tensors are walked from the last to the first: the last ones reduced are the
   ones still in cache. */
AM_EXPORT int AM_FN(sgd_apply)(int64_t count, const int64_t *numel, void *const *xs,
                               void *const *gs, void *const *ds, const uint8_t *first,
                               const TYPE *gamma, int64_t gamma_stride, const double *hp,
                               int64_t nthreads) {
    const TYPE gmul = (TYPE)hp[0], wd = (TYPE)hp[1], mlr = (TYPE)(-hp[2]);
    for (int64_t j = count - 1; j >= 0; j--)
        AM_FN(sgd_apply_one)(numel[j], (TYPE *)xs[j], (const TYPE *)gs[j], (TYPE *)ds[j],
                             gamma[j * gamma_stride], mlr, gmul, wd, first[j] != 0, nthreads);
    return 0;
}

/* ================================================================== AM-Adam(W) */

/* Constants of one tensor, in the parameter dtype. With cs = c sqrt(1/bias2) and
   ce = c eps, the preconditioner is p = c (eps + sqrt(v / bias2)) = s cs + ce, s = sqrt(v),
   and every quantity affine in s (or in v = s^2) is one multiply-add, for short chains:
     p (1 + lam p) = v ka + s kb + kc,   lam p = s lcs + lce,   -lr (1 + lam p) = s mls + mlc.
   fast: the numerator's weights (_rule.adam_weights) are the rule's, a1 = -lam a0 with
   a0 != 0, so that a0 S0 + a1 S1 + a2 S2 = a0 sum w (t + lam p (t - (d-g)^2)) with
   t = g (g + r2 d), r2 = a2 / a0; other weights are summed by their definition. */
typedef struct {
    TYPE gmul, l2, omb2, cs, ce, lam, decay, shrink, safe_min;
    TYPE ka, kb, kc, lcs, lce, mls, mlc, r2;
    int fast;
    double a[5];
} AM_FN(adam_k);

/* hp: gmul, l2, beta2, eps, lam, lr, decay, shrink, a0, a1, a2, a3, a4 */
static inline AM_FN(adam_k)
    AM_FN(adam_constants)(const double *hp, TYPE c, double ib2) {
    AM_FN(adam_k) k;
    const double cs = (double)c * sqrt(ib2), ce = (double)c * hp[3], lam = hp[4];
    const double mlr = -hp[5];
    k.gmul = (TYPE)hp[0];
    k.l2 = (TYPE)hp[1];
    k.omb2 = (TYPE)(1.0 - hp[2]);
    k.cs = (TYPE)cs;
    k.ce = (TYPE)ce;
    k.lam = (TYPE)lam;
    k.decay = (TYPE)hp[6];
    k.shrink = (TYPE)hp[7];
    for (int q = 0; q < 5; q++) k.a[q] = hp[8 + q];
    k.ka = (TYPE)(lam * cs * cs);
    k.kb = (TYPE)(cs * (1.0 + 2.0 * lam * ce));
    k.kc = (TYPE)(ce * (1.0 + lam * ce));
    k.lcs = (TYPE)(lam * cs);
    k.lce = (TYPE)(lam * ce);
    k.mls = (TYPE)(mlr * lam * cs);
    k.mlc = (TYPE)(mlr * (1.0 + lam * ce));
    k.fast = k.a[0] != 0.0 && k.a[1] == -lam * k.a[0];
    k.r2 = (TYPE)(k.fast ? k.a[2] / k.a[0] : 0.0);
    /* The weights 1/p, w and u are at most max(1, 1/ce): a block of AM_BLOCK terms
       carries at most AM_BLOCK 2^-149 max(1, 1/ce) from subnormal squares, below 2^-17
       (the float block sum's own relative error) of any block sum above
       AM_BLOCK 2^-132 max(1, 1/ce) (2^-123 for 512-element blocks). With eps = 0
       (ce = 0) every nonzero block is summed in double. */
    {
        const double floor_ = ldexp((double)AM_BLOCK, -132);
        double ce_ = (double)k.ce, bound = ce_ >= 1.0 ? floor_ : floor_ / ce_;
        k.safe_min = (TYPE)(bound > (double)AM_SAFE_MIN ? bound : (double)AM_SAFE_MIN);
    }
    return k;
}

/* The gradient g gmul (+ l2 x); has_gmul and has_l2 are compile-time constants of each
   loop (adam_reduce_one). */
#define AM_ADAM_GRAD(i, gi)                                                                  \
    TYPE gi = g[i];                                                                          \
    if (has_gmul) gi = gi * gmul;                                                            \
    if (has_l2) gi = AM_FMA(l2, x[i], gi);

/* The second moment's update beta2 v + (1 - beta2) g^2, as v + (1 - beta2)(g^2 - v): one
   formula for every block, whichever loop sums it. */
#define AM_ADAM_V(vo, gg) AM_FMA(omb2, (gg) - (vo), (vo))

/* The AM-Adam reduce terms of element i by their definition, given the updated v (vn):
   p in the parameter dtype (as in the apply pass), everything after it in dtype T. With
   w = 1/(p (1 + lam p)), 1/p = w (1 + lam p) and u = 1/(1 + lam p) = p w, the sums
     S0 = sum g^2/p, S1 = sum u (d-g)^2 = sum p e, S2 = sum g d/p, S3 = sum g x, S4 = sum d x
   (S2..S4 only when one of their weights is nonzero), D = sum e with e = w (d-g)^2, and
   R = sum w (d^2 + g^2). Used, in double, for the blocks the fast loop cannot sum. */
#define AM_ADAM_TERMS(T, i, gi, vn, S0, S1, S2, S3, S4, SD, SR)                             \
    TYPE p_ = AM_FMA(SQRT(vn), cs, ce);                                                      \
    TYPE one_lp_ = AM_FMA(lam, p_, (TYPE)1);                                                 \
    T p = (T)p_, one_lp = (T)one_lp_;                                                        \
    T w = (T)1 / (p * one_lp);                                                               \
    T g_ = (T)(gi), d_ = (T)d[i], dv = d_ - g_;                                              \
    T gg = g_ * g_;                                                                          \
    T ip = w * one_lp;                                                                       \
    T e = w * (dv * dv);                                                                     \
    S0 += ip * gg;                                                                           \
    S1 += p * e;                                                                             \
    if (has_x) {                                                                             \
        T xi = (T)x[i];                                                                      \
        S2 += (ip * g_) * d_;                                                                \
        S3 += g_ * xi;                                                                       \
        S4 += d_ * xi;                                                                       \
    }                                                                                        \
    SD += e;                                                                                 \
    SR += w * (d_ * d_ + gg);

/* The block [b0, b1) summed in double by the definition above (v is updated already);
   N = sum_k a_k S_k. */
#define AM_ADAM_BLOCK_IN_DOUBLE(b0, b1)                                                      \
    do {                                                                                     \
        double w0 = 0, w1 = 0, w2 = 0, w3 = 0, w4 = 0, wd = 0, wr = 0;                       \
        for (int64_t i = (b0); i < (b1); i++) {                                              \
            AM_ADAM_GRAD(i, gi)                                                              \
            TYPE vn = v[i];                                                                  \
            AM_ADAM_TERMS(double, i, gi, vn, w0, w1, w2, w3, w4, wd, wr)                     \
        }                                                                                    \
        double num = a[0] * w0 + a[1] * w1;                                                  \
        if (has_x) num += a[2] * w2 + a[3] * w3 + a[4] * w4;                                 \
        am_add(&acc[0], num);                                                                \
        am_add(&acc[1], wd);                                                                 \
        am_add(&acc[2], wr);                                                                 \
    } while (0)

/* reduce over [lo, hi): the v update (in place), then per block, with s = sqrt(v) and
   w = 1 / (p (1 + lam p)) (adam_k), the sums
     sn = sum w (t + lam p (t - (d-g)^2)), t = g (g + r2 d),
     s3 = S3, s4 = S4, sd = D = sum w (d-g)^2, sr = R = sum w (d^2 + g^2);
   each block's N = a0 sn + a3 s3 + a4 s4 is formed in double. The weight comes last
   (short chains from v), and the numerator is one float sum: fewer accumulators and
   live constants, 14 % faster in cache than five weighted sums on AMD Zen 3. The
   squares are formed before they are weighted: a square or product below float's
   normal range carries an absolute error of at most 2^-150, times a weight of at most
   1/(c eps); adam_constants sets the block sums' lower bound so that such errors stay
   below the float summation's own. */
AM_INLINE void AM_FN(adam_reduce_range)(int64_t lo, int64_t hi, const TYPE *restrict x,
                                        const TYPE *restrict g, const TYPE *restrict d,
                                        TYPE *restrict v, const AM_FN(adam_k) *k,
                                        const int has_gmul, const int has_l2,
                                        const int has_x, am_sum *acc) {
    const TYPE gmul = k->gmul, l2 = k->l2, omb2 = k->omb2;
    const TYPE cs = k->cs, ce = k->ce, lam = k->lam, safe_min = k->safe_min;
    const TYPE ka = k->ka, kb = k->kb, kc = k->kc, lcs = k->lcs, lce = k->lce, r2 = k->r2;
    const double *a = k->a;
    (void)safe_min; /* float only */
    for (int64_t b0 = lo; b0 < hi; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < hi ? b0 + AM_BLOCK : hi;
        if (!k->fast) {
            for (int64_t i = b0; i < b1; i++) {
                AM_ADAM_GRAD(i, gi)
                v[i] = AM_ADAM_V(v[i], gi * gi);
            }
            AM_ADAM_BLOCK_IN_DOUBLE(b0, b1);
            continue;
        }
        TYPE sn = 0, s3 = 0, s4 = 0, sd = 0, sr = 0;
#pragma omp simd reduction(+ : sn, s3, s4, sd, sr)
        for (int64_t i = b0; i < b1; i++) {
            AM_ADAM_GRAD(i, gi)
            TYPE gg = gi * gi, vo = v[i];
            TYPE vn = AM_ADAM_V(vo, gg);
            v[i] = vn;
            TYPE sq = SQRT(vn);
            TYPE w = (TYPE)1 / AM_FMA(sq, kb, AM_FMA(vn, ka, kc));
            TYPE lp = AM_FMA(sq, lcs, lce);
            TYPE di = d[i], dv = di - gi, dv2 = dv * dv;
            TYPE t = has_x ? AM_FMA(gi * di, r2, gg) : gg;
            sn = AM_FMA(w, AM_FMA(lp, t - dv2, t), sn);
            if (has_x) {
                TYPE xi = x[i];
                s3 = AM_FMA(gi, xi, s3);
                s4 = AM_FMA(di, xi, s4);
            }
            sd = AM_FMA(w, dv2, sd);
            sr = AM_FMA(w, AM_FMA(di, di, gg), sr);
        }
#if !AM_DOUBLE
        if (AM_UNSAFE(fabsf(sn) + sd + sr, safe_min, b0, b1, g, d)) {
            AM_ADAM_BLOCK_IN_DOUBLE(b0, b1);
            continue;
        }
#endif
        double num = a[0] * (double)sn;
        if (has_x) num += a[3] * (double)s3 + a[4] * (double)s4;
        am_add(&acc[0], num);
        am_add(&acc[1], (double)sd);
        am_add(&acc[2], (double)sr);
    }
}

static void AM_FN(adam_reduce_one)(int64_t n, const TYPE *x, const TYPE *g, const TYPE *d,
                                   TYPE *v, const AM_FN(adam_k) *k, int64_t nt, double *out) {
    const int has_gmul = k->gmul != (TYPE)1, has_l2 = k->l2 != (TYPE)0;
    const int has_x = k->a[2] != 0.0 || k->a[3] != 0.0 || k->a[4] != 0.0;
    /* One loop per combination of the flags (GCC vectorises no loop that holds both
       fma() and a branch on a run-time flag); the loops for a gradient scale or an L2
       term multiply by gmul, exactly when it is 1. */
    AM_PARALLEL_REDUCE(n, nt, 3, out, {
        if (has_l2 && has_x)
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 1, 1, 1, acc);
        else if (has_l2)
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 1, 1, 0, acc);
        else if (has_gmul && has_x)
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 1, 0, 1, acc);
        else if (has_gmul)
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 1, 0, 0, acc);
        else if (has_x)
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 0, 0, 1, acc);
        else
            AM_FN(adam_reduce_range)(lo, hi, x, g, d, v, k, 0, 0, 0, acc);
    });
}

/* c[j * c_stride]: bias correction 1 - beta1_max prod of tensor j's scope; ib2[j]:
   1 / (1 - beta2^step_j). sums: count x 3 doubles, [N, D, ref] of each tensor. */
AM_EXPORT int AM_FN(adam_reduce)(int64_t count, const int64_t *numel, void *const *xs,
                                 void *const *gs, void *const *ds, void *const *vs,
                                 const TYPE *c, int64_t c_stride, const double *ib2,
                                 const double *hp, int64_t nthreads, double *sums) {
    for (int64_t j = 0; j < count; j++) {
        AM_FN(adam_k) k = AM_FN(adam_constants)(hp, c[j * c_stride], ib2[j]);
        AM_FN(adam_reduce_one)(numel[j], (const TYPE *)xs[j], (const TYPE *)gs[j],
                               (const TYPE *)ds[j], (TYPE *)vs[j], &k, nthreads,
                               sums + 3 * j);
    }
    return 0;
}

/* x update of the apply pass given step = -lr d / p: mode 0 (decoupled)
   x = decay x + step (x + step without decay), mode 1 (proximal) x = shrink (x + step).
   mode and has_wd are compile-time constants of each loop. */
#define AM_X_UPDATE(xi, step, decay, shrink, mode, has_wd)                                   \
    do {                                                                                     \
        if ((mode) == 1)                                                                     \
            xi = (xi + (step)) * (shrink);                                                   \
        else if (has_wd)                                                                     \
            xi = AM_FMA(xi, decay, step);                                                    \
        else                                                                                 \
            xi = xi + (step);                                                                \
    } while (0)

/* apply over [lo, hi), recomputing s = sqrt(v) and w = 1 / (p (1 + lam p)) from v:
   d = g + (beta + lam p)/(1 + lam p) (d - g), formed as d - (1 - beta) p (d - g) w, and
   the x update with -lr / p = -lr (1 + lam p) w. */
AM_INLINE void AM_FN(adam_apply_range)(int64_t lo, int64_t hi, TYPE *restrict x,
                                       const TYPE *restrict g, TYPE *restrict d,
                                       const TYPE *restrict v, const AM_FN(adam_k) *k,
                                       const TYPE beta, const int has_gmul, const int has_l2,
                                       const int mode, const int has_wd) {
    const TYPE gmul = k->gmul, l2 = k->l2, decay = k->decay, shrink = k->shrink;
    const TYPE ka = k->ka, kb = k->kb, kc = k->kc, mls = k->mls, mlc = k->mlc;
    /* (1 - beta) p = s obs + obc */
    const TYPE obs = (TYPE)((1.0 - (double)beta) * (double)k->cs);
    const TYPE obc = (TYPE)((1.0 - (double)beta) * (double)k->ce);
    AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
        TYPE gi = g[i], xi = x[i];
        if (has_gmul) gi = gi * gmul;
        if (has_l2) gi = AM_FMA(l2, xi, gi);
        TYPE vi = v[i], sq = SQRT(vi);
        TYPE w = (TYPE)1 / AM_FMA(sq, kb, AM_FMA(vi, ka, kc));
        TYPE di = d[i];
        TYPE dn = AM_FMA(-(AM_FMA(sq, obs, obc) * (di - gi)), w, di);
        d[i] = dn;
        TYPE step = dn * (AM_FMA(sq, mls, mlc) * w);
        AM_X_UPDATE(xi, step, decay, shrink, mode, has_wd);
        x[i] = xi;
    }
    AM_CHUNKS_END
}

static void AM_FN(adam_apply_one)(int64_t n, TYPE *x, const TYPE *g, TYPE *d, const TYPE *v,
                                  const AM_FN(adam_k) *k, TYPE beta, int mode, int64_t nt) {
    const int has_gmul = k->gmul != (TYPE)1, has_l2 = k->l2 != (TYPE)0;
    const int has_wd = k->decay != (TYPE)1; /* decoupled decay (mode 0) */
    /* compile-time flags in every loop, as in adam_reduce_one: the proximal loops always
       multiply by shrink (1 without decay) and the loops for a gradient scale or an L2
       term by decay (exactly, when it is 1), so they take has_wd = 1 */
    AM_PARALLEL_APPLY(n, nt, {
        if (has_l2 && mode == 1) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 1, 1, 1, 1);
        } else if (has_l2) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 1, 1, 0, 1);
        } else if (has_gmul && mode == 1) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 1, 0, 1, 1);
        } else if (has_gmul) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 1, 0, 0, 1);
        } else if (mode == 1) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 0, 0, 1, 1);
        } else if (has_wd) {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 0, 0, 0, 1);
        } else {
            AM_FN(adam_apply_range)(lo, hi, x, g, d, v, k, beta, 0, 0, 0, 0);
        }
    });
}

/* beta[j * beta_stride]: beta of tensor j's scope (stride 0: one for all); mode 0
   decoupled (also AM-Adam's l2, with decay 1), 1 proximal. Last tensor first. */
AM_EXPORT int AM_FN(adam_apply)(int64_t count, const int64_t *numel, void *const *xs,
                                void *const *gs, void *const *ds, void *const *vs,
                                const TYPE *c, int64_t c_stride, const double *ib2,
                                const TYPE *beta, int64_t beta_stride, const double *hp,
                                int64_t mode, int64_t nthreads) {
    for (int64_t j = count - 1; j >= 0; j--) {
        AM_FN(adam_k) k = AM_FN(adam_constants)(hp, c[j * c_stride], ib2[j]);
        AM_FN(adam_apply_one)(numel[j], (TYPE *)xs[j], (const TYPE *)gs[j], (TYPE *)ds[j],
                              (const TYPE *)vs[j], &k, beta[j * beta_stride], (int)mode,
                              nthreads);
    }
    return 0;
}

/* ================================================================== whole steps */

/* A whole step over the chunks [chunks[2q], chunks[2q+1]) of tensors: reduce a chunk,
   run the rule's tape (amopt/_tape.py) on each scope's sums, apply the chunk while it is
   still in cache. per_layer: one scope per tensor; else one chunk of every tensor and
   one scope, the sum of their rows. outs: the registers of beta (and gamma). The outputs
   are rounded to the parameter dtype. extra: the rule's fourth input of tensor j's scope,
   extra[j * extra_stride] (the learning-rate ratio r, stride 0; AM-Adam's first-step
   flag; the global scope's at extra[0]). Returns 0, or -1 for a malformed tape. */
static int AM_FN(scope_rule)(const am_insn *code, int64_t ncode, const int64_t *outs,
                             int64_t nouts, const double *sums, int64_t a, int64_t b,
                             int64_t per_layer, TYPE *const *dst, const double *extra,
                             int64_t extra_stride) {
    double r[AM_MAX_TAPE];
    if (!per_layer) {
        double total[4] = {0.0, 0.0, 0.0, extra[0]};
        for (int64_t j = a; j < b; j++)
            for (int k = 0; k < 3; k++) total[k] += sums[3 * j + k];
        if (am_run_tape(code, ncode, total, 4, r)) return -1;
        for (int64_t o = 0; o < nouts; o++) dst[o][0] = (TYPE)r[outs[o]];
        return 0;
    }
    for (int64_t j = a; j < b; j++) {
        double in[4] = {sums[3 * j], sums[3 * j + 1], sums[3 * j + 2], extra[j * extra_stride]};
        if (am_run_tape(code, ncode, in, 4, r)) return -1;
        for (int64_t o = 0; o < nouts; o++) dst[o][j] = (TYPE)r[outs[o]];
    }
    return 0;
}

AM_EXPORT int AM_FN(sgd_step)(int64_t count, const int64_t *numel, void *const *xs,
                              void *const *gs, void *const *ds, const uint8_t *first,
                              const double *hp, int64_t nthreads, const int64_t *chunks,
                              int64_t nchunks, int64_t per_layer, const am_insn *code,
                              int64_t ncode, const int64_t *outs, double *sums, TYPE *betas,
                              TYPE *gammas, const double *extra, int64_t extra_stride) {
    TYPE *dst[2] = {betas, gammas};
    (void)count;
    if (am_check_tape(code, ncode, outs, 2, 4)) return -1;
    for (int64_t q = 0; q < nchunks; q++) {
        int64_t a = chunks[2 * q], b = chunks[2 * q + 1];
        AM_FN(sgd_reduce)(b - a, numel + a, xs + a, gs + a, ds + a, first + a, hp, nthreads,
                          sums + 3 * a);
        if (AM_FN(scope_rule)(code, ncode, outs, 2, sums, a, b, per_layer, dst, extra,
                              extra_stride))
            return -1;
        AM_FN(sgd_apply)(b - a, numel + a, xs + a, gs + a, ds + a, first + a,
                         per_layer ? gammas + a : gammas, per_layer, hp, nthreads);
    }
    return 0;
}

AM_EXPORT int AM_FN(adam_step)(int64_t count, const int64_t *numel, void *const *xs,
                               void *const *gs, void *const *ds, void *const *vs,
                               const TYPE *c, int64_t c_stride, const double *ib2,
                               const double *hp, int64_t mode, int64_t nthreads,
                               const int64_t *chunks, int64_t nchunks, int64_t per_layer,
                               const am_insn *code, int64_t ncode, const int64_t *outs,
                               double *sums, TYPE *betas, const double *extra,
                               int64_t extra_stride) {
    TYPE *dst[1] = {betas};
    (void)count;
    if (am_check_tape(code, ncode, outs, 1, 4)) return -1;
    for (int64_t q = 0; q < nchunks; q++) {
        int64_t a = chunks[2 * q], b = chunks[2 * q + 1];
        AM_FN(adam_reduce)(b - a, numel + a, xs + a, gs + a, ds + a, vs + a,
                           c + a * c_stride, c_stride, ib2 + a, hp, nthreads, sums + 3 * a);
        if (AM_FN(scope_rule)(code, ncode, outs, 1, sums, a, b, per_layer, dst, extra,
                              extra_stride))
            return -1;
        AM_FN(adam_apply)(b - a, numel + a, xs + a, gs + a, ds + a, vs + a, c + a * c_stride,
                          c_stride, ib2 + a, per_layer ? betas + a : betas, per_layer, hp, mode,
                          nthreads);
    }
    return 0;
}

/* ================================================================== memory floor */

/* adam_traffic's first pass over [lo, hi): reads g, d, v (and x), writes v. */
AM_INLINE void AM_FN(traffic_read_range)(int64_t lo, int64_t hi, const TYPE *restrict x,
                                         const TYPE *restrict g, const TYPE *restrict d,
                                         TYPE *restrict v, const TYPE one, const TYPE zero,
                                         const int has_x, am_sum *acc) {
    for (int64_t b0 = lo; b0 < hi; b0 += AM_BLOCK) {
        int64_t b1 = b0 + AM_BLOCK < hi ? b0 + AM_BLOCK : hi;
        TYPE s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = b0; i < b1; i++) {
            TYPE vn = AM_FMA(v[i], one, g[i] * zero);
            v[i] = vn;
            s += (g[i] + d[i]) + (has_x ? vn + x[i] : vn);
        }
        am_add(&acc[0], (double)s);
    }
}

/* adam_traffic's second pass over [lo, hi): reads x, g, d, v, writes x and d. */
AM_INLINE void AM_FN(traffic_write_range)(int64_t lo, int64_t hi, TYPE *restrict x,
                                          const TYPE *restrict g, TYPE *restrict d,
                                          const TYPE *restrict v, const TYPE one,
                                          const TYPE zero) {
    AM_CHUNKS_BACKWARDS(lo, hi, c0, c1)
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
        TYPE gi = g[i], di = d[i];
        d[i] = AM_FMA(di, one, gi * zero);
        x[i] = AM_FMA(x[i], one, (gi + di + v[i]) * zero);
    }
    AM_CHUNKS_END
}

/* The memory traffic of adam_step with next to no arithmetic, for amopt.bench: per chunk
   [chunks[2q], chunks[2q+1]) of tensors, a pass that reads g, d, v (and x with has_x)
   and writes v, then a pass, over the same tensors in the apply order, that reads x, g,
   d, v and writes x and d. The values written are the values read (one = 1, zero = 0 at
   run time, for finite data), so the tensors keep their contents. sums[q]: the sum of
   everything the first pass read in chunk q, so that no load can be dropped. A two-pass
   step over tensors in this layout costs at least this much. */
AM_EXPORT int AM_FN(adam_traffic)(int64_t count, const int64_t *numel, void *const *xs,
                                  void *const *gs, void *const *ds, void *const *vs,
                                  int64_t has_x, const double *one_zero, int64_t nthreads,
                                  const int64_t *chunks, int64_t nchunks, double *sums) {
    const TYPE one = (TYPE)one_zero[0], zero = (TYPE)one_zero[1];
    (void)count;
    for (int64_t q = 0; q < nchunks; q++) {
        int64_t a = chunks[2 * q], b = chunks[2 * q + 1];
        double total = 0.0;
        for (int64_t j = a; j < b; j++) {
            const TYPE *x = (const TYPE *)xs[j], *g = (const TYPE *)gs[j];
            const TYPE *d = (const TYPE *)ds[j];
            TYPE *v = (TYPE *)vs[j];
            double part[1];
            AM_PARALLEL_REDUCE(numel[j], nthreads, 1, part, {
                if (has_x)
                    AM_FN(traffic_read_range)(lo, hi, x, g, d, v, one, zero, 1, acc);
                else
                    AM_FN(traffic_read_range)(lo, hi, x, g, d, v, one, zero, 0, acc);
            });
            total += part[0];
        }
        sums[q] = total;
        for (int64_t j = b - 1; j >= a; j--) {
            TYPE *x = (TYPE *)xs[j], *d = (TYPE *)ds[j];
            const TYPE *g = (const TYPE *)gs[j], *v = (const TYPE *)vs[j];
            AM_PARALLEL_APPLY(numel[j], nthreads,
                              { AM_FN(traffic_write_range)(lo, hi, x, g, d, v, one, zero); });
        }
    }
    return 0;
}

#undef AM_FN
#undef AM_FN2
#undef AM_FN_
#undef TYPE
#undef SUF
#undef SQRT
#undef FMA_
#undef AM_FMA
#undef AM_DOUBLE
