/* Private to the forward stage: OpenBLAS, loaded on demand.
 *
 * Why dlopen and not a link-time dependency: OpenBLAS (pthread build)
 * starts its thread pool when the library is loaded, before main(). Those
 * threads have every signal unblocked, so in a process that blocks SIGINT
 * in main() and reads it from a signalfd (tokpipe generate) the kernel
 * delivers the signal to an OpenBLAS thread instead and the default action
 * kills the process. Linking it into libtokpipe would load it into every
 * program; loaded here, only a process that opts in to the OpenBLAS kernel
 * has it, its threads inherit the caller's signal mask, and
 * OPENBLAS_CORETYPE is read at that moment (any time before the first
 * opt-in), not only before main(). */
#ifndef TOKPIPE_FORWARD_BLAS_H
#define TOKPIPE_FORWARD_BLAS_H

#include <cblas.h>

#include "tokpipe/error.h"

#define TP_OPENBLAS_SONAME "libopenblas.so.0"

typedef struct tp_blas {
    void *lib; /* dlopen handle; NULL: not loaded */
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_corename) *get_corename;
} tp_blas;

/* Load the library and its functions into *b (each caller holds its own
 * reference). TP_ENOTFOUND naming the library or symbol on failure, *b
 * then unloaded. */
int tp_blas_open(tp_blas *b, tp_err *err);

/* Drop the reference; a zeroed or closed *b is fine. */
void tp_blas_close(tp_blas *b);

#endif
