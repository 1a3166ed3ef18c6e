/* optim: schedule, clipping and AdamW. */
#include "optim.h"

#include <math.h>
#include <string.h>

double optim_lr(const cfg_training *t, long step) {
  if (step < t->warmup_steps) return t->lr * (double)(step + 1) / (double)t->warmup_steps;
  if (strcmp(t->lr_decay, "constant") == 0) return t->lr;
  if (step >= t->decay_steps) return t->min_lr;
  double span = (double)(t->decay_steps - t->warmup_steps);
  double p = span > 0 ? (double)(step - t->warmup_steps) / span : 1.0;
  if (strcmp(t->lr_decay, "linear") == 0) return t->lr - p * (t->lr - t->min_lr);
  return t->min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * p)) * (t->lr - t->min_lr);
}

double optim_grad_sumsq(const gpt_model *m) { return m->be->sumsq(m->grads, m->nparams); }

double optim_clip_scale(const cfg_training *t, double grad_norm) {
  if (t->grad_clip <= 0.0) return 1.0;
  double c = t->grad_clip / (grad_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

void optim_adamw_step(gpt_model *m, const cfg_training *t, long step, double lr, double grad_scale) {
  backend_adamw_args a = {
      .lr = (float)lr,
      .beta1 = (float)t->beta1,
      .beta2 = (float)t->beta2,
      .eps = (float)t->adam_eps,
      .grad_scale = (float)grad_scale,
      .step = (int)(step + 1),
  };
  /* consecutive tensors with the same decay setting go in one call */
  for (int i = 0; i < m->ntensors;) {
    int j = i + 1;
    while (j < m->ntensors && m->tensors[j].decay == m->tensors[i].decay) j++;
    size_t off = m->tensors[i].offset, n = m->tensors[j - 1].offset + m->tensors[j - 1].numel - off;
    a.weight_decay = m->tensors[i].decay ? (float)t->weight_decay : 0.0f;
    m->be->adamw(m->params + off, m->grads + off, m->adam_m + off, m->adam_v + off, n, &a);
    i = j;
  }
}
