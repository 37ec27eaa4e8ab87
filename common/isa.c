/* The vector level the kernels take (isa.h). */
#include "tokpipe/isa.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static const char *const NAMES[] = {"portable", "avx2", "avx512"};

/* F16C by CPUID: clang's __builtin_cpu_supports does not know "f16c". */
static bool cpu_f16c(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return false;
#endif
}

static int detect_cpu(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_f16c();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl");
    /* AVX-512 code also uses the AVX2 helpers (F16C conversions, masks of
     * AVX2 width): a CPU level includes the ones below it */
    return avx2 && avx512 ? TP_ISA_AVX512 : avx2 ? TP_ISA_AVX2 : TP_ISA_PORTABLE;
#else
    return TP_ISA_PORTABLE;
#endif
}

static bool detect_vnni(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

/* Facts of the CPU and the process's cap, found once: the kernels ask on
 * every call (a row range of a matmul), and CPUID traps to the hypervisor
 * in a VM (about 10 us on a KVM guest). -1: not yet known. Written once
 * with the value every thread would compute (the cap only by tests). */
static _Atomic int cpu_level = -1, cap_level = -1, vnni = -1;

tp_isa tp_isa_cpu(void)
{
    int l = atomic_load_explicit(&cpu_level, memory_order_relaxed);
    if (l < 0) {
        l = detect_cpu();
        atomic_store_explicit(&cpu_level, l, memory_order_relaxed);
    }
    return (tp_isa)l;
}

static int env_cap(void)
{
    const char *v = getenv("TP_ISA");
    tp_isa isa;
    tp_err e;
    if (!v || !*v)
        return TP_ISA_AVX512;
    if (tp_isa_parse(v, &isa, &e)) {
        fprintf(stderr, "tokpipe: TP_ISA ignored: %s\n", e.msg);
        return TP_ISA_AVX512;
    }
    return isa;
}

tp_isa tp_isa_active(void)
{
    int cap = atomic_load_explicit(&cap_level, memory_order_relaxed);
    if (cap < 0) {
        cap = env_cap();
        atomic_store_explicit(&cap_level, cap, memory_order_relaxed);
    }
    tp_isa cpu = tp_isa_cpu();
    return (int)cpu < cap ? cpu : (tp_isa)cap;
}

bool tp_isa_have_vnni(void)
{
    if (tp_isa_active() < TP_ISA_AVX512)
        return false;
    int v = atomic_load_explicit(&vnni, memory_order_relaxed);
    if (v < 0) {
        v = detect_vnni();
        atomic_store_explicit(&vnni, v, memory_order_relaxed);
    }
    return v;
}

const char *tp_isa_name(tp_isa isa)
{
    return (unsigned)isa < sizeof NAMES / sizeof NAMES[0] ? NAMES[isa] : "unknown";
}

int tp_isa_parse(const char *name, tp_isa *out, tp_err *err)
{
    for (int i = 0; name && i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (tp_isa)i;
            return 0;
        }
    return tp_err_set(err, TP_EINVAL, "isa '%.32s' is not one of portable, avx2, avx512", name ? name : "");
}

void tp_isa_cap_for_tests(tp_isa cap)
{
    atomic_store_explicit(&cap_level, (int)cap, memory_order_relaxed);
}
