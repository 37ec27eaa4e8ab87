/* Which vector instructions the kernels may use: one place decides.
 *
 * The forward, sample and grammar kernels each have a portable path and
 * vector paths (AVX2, AVX-512) that give the portable path's bits, so a job
 * may move between hosts of different CPUs without its stream changing.
 * Every kernel asks tp_isa_active() which paths it may take: the best this
 * CPU has, capped by the environment variable TP_ISA (portable, avx2 or
 * avx512), read once. The cap lets a test, or a user who suspects a
 * kernel, run an AVX2 or portable process on an AVX-512 machine. */
#ifndef TOKPIPE_ISA_H
#define TOKPIPE_ISA_H

#include <stdbool.h>

#include "tokpipe/error.h"

typedef enum tp_isa {
    TP_ISA_PORTABLE = 0, /* plain C: any x86-64 (or another CPU) */
    TP_ISA_AVX2 = 1,     /* AVX2 with FMA and F16C (Haswell, Zen 1 and later) */
    TP_ISA_AVX512 = 2,   /* AVX-512 F, BW and VL (Skylake-X, Zen 4 and later) */
} tp_isa;

/* The best level this CPU supports, whatever the cap. */
tp_isa tp_isa_cpu(void);

/* The level the kernels take: tp_isa_cpu() capped by TP_ISA (or by
 * tp_isa_cap_for_tests). An invalid TP_ISA is reported once on stderr and
 * ignored. Cheap: ask it on every call. */
tp_isa tp_isa_active(void);

/* AVX-512 VNNI (the integer dot products of the typed AVX-512 kernels):
 * true only where tp_isa_active() is TP_ISA_AVX512 and the CPU has it. */
bool tp_isa_have_vnni(void);

/* "portable", "avx2", "avx512". */
const char *tp_isa_name(tp_isa isa);

/* Parse a name as above; TP_EINVAL naming the value and the choices. */
int tp_isa_parse(const char *name, tp_isa *out, tp_err *err);

/* Tests only: cap the kernels at `cap` (levels above the CPU's stay off)
 * from now on, for the whole process. Call it only while no forward,
 * sampler or matrix panel built under another cap is in use: panels are
 * laid out for the level active when they were built. */
void tp_isa_cap_for_tests(tp_isa cap);

#endif
