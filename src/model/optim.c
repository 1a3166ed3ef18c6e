/* optim: schedule, clipping and AdamW on a range of the parameter buffer. */
#include "model/optim.h"

#include <math.h>
#include <string.h>

void optim_init(optim_state *o, const backend *be, size_t lo, size_t hi) {
  o->be = be;
  o->lo = lo;
  o->hi = hi;
  o->m = be->alloc(be, (hi - lo) * sizeof(float));
  o->v = be->alloc(be, (hi - lo) * sizeof(float));
}

void optim_free(optim_state *o) {
  o->be->free(o->be, o->m);
  o->be->free(o->be, o->v);
  memset(o, 0, sizeof *o);
}

size_t optim_bytes(size_t n) { return 2 * n * sizeof(float); }

double optim_lr(const cfg_training *t, long step) {
  if (step < t->warmup_steps) return t->lr * (double)(step + 1) / (double)t->warmup_steps;
  cfg_training_lr_decay decay = cfg_training_lr_decay_of(t);
  if (decay == CFG_DECAY_CONSTANT) return t->lr;
  if (step >= t->decay_steps) return t->min_lr;
  double span = (double)(t->decay_steps - t->warmup_steps);
  double p = span > 0 ? (double)(step - t->warmup_steps) / span : 1.0;
  if (decay == CFG_DECAY_LINEAR) return t->lr - p * (t->lr - t->min_lr);
  return t->min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * p)) * (t->lr - t->min_lr);
}

void optim_adamw_step(optim_state *o, gpt_model *m, const cfg_training *t, long step, double lr, double loss_scale,
                      const double *sums) {
  backend_adamw_args a = {
      .lr = (float)lr,
      .beta1 = (float)t->beta1,
      .beta2 = (float)t->beta2,
      .eps = (float)t->adam_eps,
      .loss_scale = loss_scale,
      .grad_clip = t->grad_clip,
      .sums = sums,
      .step = (int)(step + 1),
  };
  /* each tensor's part of [lo, hi), consecutive tensors with the same decay in one call */
  for (int i = 0; i < m->ntensors;) {
    int j = i + 1;
    while (j < m->ntensors && m->tensors[j].decay == m->tensors[i].decay) j++;
    size_t b0 = m->tensors[i].offset, b1 = m->tensors[j - 1].offset + m->tensors[j - 1].numel;
    if (b0 < o->lo) b0 = o->lo;
    if (b1 > o->hi) b1 = o->hi;
    if (b1 > b0) {
      a.weight_decay = m->tensors[i].decay ? (float)t->weight_decay : 0.0f;
      m->be->adamw(m->be, m->params + b0, gpt_compute_params(m, b0), m->grads + b0, o->m + (b0 - o->lo), o->v + (b0 - o->lo), b1 - b0, &a);
    }
    i = j;
  }
}

void optim_scaler_init(optim_scaler *s, int enabled, double initial, long window) {
  s->enabled = enabled;
  s->scale = enabled ? initial : 1.0;
  s->window = window;
  s->good = 0;
}

int optim_scaler_update(optim_scaler *s, int finite) {
  if (!s->enabled) return finite ? 1 : -1;
  if (!finite) {
    s->good = 0;
    if (s->scale < 2.0) return -1; /* even unscaled gradients overflow */
    s->scale *= 0.5;
    return 0;
  }
  if (++s->good >= s->window) {
    s->scale *= 2.0;
    s->good = 0;
  }
  return 1;
}
