/* One ISA variant of the kernels: am_fused_kernels.h for float and for double, named
 * after AM_ISA. Included by am_fused.c once per variant, after it has pushed the
 * variant's target options, set AM_TARGETED (left unset for the baseline),
 * AM_HAS_FMA (1: fma() is one instruction) and AM_LANES (float lanes of a vector); the
 * options are popped here. No include guard: this file is meant to be included several
 * times.
 */

#define AM_DOUBLE 0
#include "am_fused_kernels.h"
#define AM_DOUBLE 1
#include "am_fused_kernels.h"
#undef AM_ISA
#undef AM_HAS_FMA
#undef AM_LANES

#ifdef AM_TARGETED
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#undef AM_TARGETED
#endif
