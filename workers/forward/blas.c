/* OpenBLAS loaded with dlopen (see blas.h for why). */
#include "blas.h"

#include <dlfcn.h>
#include <string.h>

static void *sym(void *lib, const char *name, tp_err *err, int *rc)
{
    void *p = *rc ? NULL : dlsym(lib, name);
    if (!p && !*rc)
        *rc = tp_err_set(err, TP_ENOTFOUND, "forward: %s has no %s", TP_OPENBLAS_SONAME, name);
    return p;
}

int tp_blas_open(tp_blas *b, tp_err *err)
{
    memset(b, 0, sizeof *b);
    /* NODELETE: unloading OpenBLAS means stopping its thread pool; once
     * loaded it stays for the life of the process. */
    b->lib = dlopen(TP_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!b->lib) {
        const char *why = dlerror();
        return tp_err_set(err, TP_ENOTFOUND, "forward: cannot load OpenBLAS: %s", why ? why : TP_OPENBLAS_SONAME);
    }
    int rc = 0;
    /* dlsym returns void *; converting it to a function pointer is what
     * POSIX requires to work. */
    *(void **)&b->sgemm = sym(b->lib, "cblas_sgemm", err, &rc);
    *(void **)&b->sgemv = sym(b->lib, "cblas_sgemv", err, &rc);
    *(void **)&b->set_num_threads = sym(b->lib, "openblas_set_num_threads", err, &rc);
    *(void **)&b->get_corename = sym(b->lib, "openblas_get_corename", err, &rc);
    if (rc)
        tp_blas_close(b);
    return rc;
}

void tp_blas_close(tp_blas *b)
{
    if (b && b->lib)
        dlclose(b->lib);
    if (b)
        memset(b, 0, sizeof *b);
}
