/* The architecture table: one line per model/arch_*.c. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

extern const tp_arch tp_arch_llama, tp_arch_qwen2, tp_arch_qwen3, tp_arch_phi3, tp_arch_gemma3, tp_arch_gemma2,
    tp_arch_qwen3moe, tp_arch_qwen35, tp_arch_qwen35moe, tp_arch_gptoss;

const tp_arch *const tp_archs[] = {
    &tp_arch_llama,
    &tp_arch_qwen2,
    &tp_arch_qwen3,
    &tp_arch_phi3,
    &tp_arch_gemma3,
    &tp_arch_gemma2,
    &tp_arch_qwen3moe,
    &tp_arch_qwen35,
    &tp_arch_qwen35moe,
    &tp_arch_gptoss,
};
const int tp_n_archs = sizeof tp_archs / sizeof tp_archs[0];

const tp_arch *tp_arch_find(const char *name, size_t len)
{
    for (int i = 0; i < tp_n_archs; i++)
        if (strlen(tp_archs[i]->name) == len && !memcmp(tp_archs[i]->name, name, len))
            return tp_archs[i];
    return NULL;
}

void tp_model_arch_names(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < tp_n_archs && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", tp_archs[i]->name);
}

tp_arch_sizes tp_arch_sizes_of(int dim, int q_dim, int kv_dim, int hidden_dim, int head_size)
{
    tp_arch_sizes z = {{0}};
    z.v[TP_SZ_EMBD] = dim;
    z.v[TP_SZ_Q] = q_dim;
    z.v[TP_SZ_KV] = kv_dim;
    z.v[TP_SZ_FF] = hidden_dim;
    z.v[TP_SZ_HEAD] = head_size;
    z.v[TP_SZ_Q2] = 2 * q_dim;
    return z;
}

void tp_arch_sizes_ssm(tp_arch_sizes *z, const tp_model_config *c)
{
    int key = c->ssm_head_dim * c->ssm_k_heads, value = c->ssm_head_dim * c->ssm_v_heads;
    z->v[TP_SZ_SSM_CONV] = 2 * key + value;
    z->v[TP_SZ_SSM_V] = value;
    z->v[TP_SZ_SSM_VH] = c->ssm_v_heads;
    z->v[TP_SZ_SSM_HEAD] = c->ssm_head_dim;
    z->v[TP_SZ_SSM_K] = c->ssm_conv_kernel;
}

void tp_arch_sizes_moe(tp_arch_sizes *z, int n_expert, int expert_ff)
{
    z->v[TP_SZ_EXPERTS] = n_expert;
    z->v[TP_SZ_FF_EXP] = expert_ff;
}

void tp_arch_sizes_heads(tp_arch_sizes *z, int n_heads) { z->v[TP_SZ_HEADS] = n_heads; }

void tp_arch_sizes_shexp(tp_arch_sizes *z, int shexp_ff)
{
    z->v[TP_SZ_FF_SHEXP] = shexp_ff;
}

bool tp_arch_tensor_in(const tp_arch_tensor *t, bool moe, bool recurrent)
{
    if (t->flags & (recurrent ? TP_AT_FULL_ATTN : TP_AT_RECURRENT))
        return false;
    return moe ? !(t->flags & TP_AT_DENSE) : !(t->flags & TP_AT_MOE);
}

int tp_arch_ne2(const tp_arch_tensor *t, const tp_arch_sizes *z)
{
    return (t->flags & TP_AT_EXPERTS) ? z->v[TP_SZ_EXPERTS] : 0;
}

void tp_arch_shape(const tp_arch_tensor *t, const tp_arch_sizes *z, int *ne0, int *ne1)
{
    *ne0 = z->v[t->ne0];
    *ne1 = z->v[t->ne1];
    for (int i = 0; i < t->n_parts; i++)
        *ne1 += z->v[t->parts[i].rows];
}
