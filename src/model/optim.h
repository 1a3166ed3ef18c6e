/* optim: learning-rate schedule, global-norm clipping and AdamW.
 *
 * AdamW follows PyTorch's torch.optim.AdamW: decoupled weight decay p -= lr*wd*p, bias-corrected
 * moments. Weight decay applies to weight matrices and embeddings (gpt_tensor.decay), never to
 * biases or LayerNorm parameters. Clipping follows torch.nn.utils.clip_grad_norm_: gradients are
 * scaled by min(1, clip / (norm + 1e-6)).
 *
 * An optimizer updates a range [lo, hi) of a model's parameter buffer and keeps the AdamW moments
 * of that range only: the whole buffer on one rank, one replica's piece with ZeRO-1. */
#ifndef GREENLM_OPTIM_H
#define GREENLM_OPTIM_H

#include "deck/cfg.h"
#include "model/gpt.h"

typedef struct {
  const backend *be;
  size_t lo, hi;
  float *m, *v; /* backend memory, (hi - lo) each */
} optim_state;

void optim_init(optim_state *o, const backend *be, size_t lo, size_t hi);
void optim_free(optim_state *o);
/* Bytes of AdamW state for a range of n parameters. */
size_t optim_bytes(size_t n);

/* Learning rate at 0-based step: linear warm-up to lr over warmup_steps, then decay
 * (cosine, linear or constant) to min_lr at decay_steps, min_lr afterwards. */
double optim_lr(const cfg_training *t, long step);

/* One AdamW step at 0-based `step` on the optimizer's range, learning rate lr, on gradients that carry loss_scale.
 * sums (backend memory, m->sums): the step's {loss sum, gradients' global sum of squares}, read by the backend: the
 * gradients are clipped to t->grad_clip by their norm and the update skipped when a sum is not finite
 * (backend_adamw_factor), without the host waiting for them. */
void optim_adamw_step(optim_state *o, gpt_model *m, const cfg_training *t, long step, double lr, double loss_scale,
                      const double *sums);

/* Dynamic loss scaling for fp16 GEMMs (the scheme of torch.cuda.amp.GradScaler): the loss gradient
 * is multiplied by `scale` so that small gradients survive fp16's range; the optimizer divides it
 * out again. A step whose gradients overflow (a non-finite norm) is skipped and the scale halved;
 * after `window` good steps in a row the scale doubles. Disabled (fp32, tf32, bf16), the scale
 * stays 1 and an overflow is a divergence. Scales are powers of two times the initial value, so
 * scaling and unscaling are exact in floating point. */
typedef struct {
  int enabled;
  double scale;
  long window, good; /* good: finite steps since the last change of scale */
} optim_scaler;

void optim_scaler_init(optim_scaler *s, int enabled, double initial, long window);
/* After a step's gradients are known: finite says whether their norm is. Returns 1 when the step
 * may be applied, 0 when it must be skipped (the scale was halved), -1 when training diverged
 * (not finite without scaling, or the scale would fall below 1). */
int optim_scaler_update(optim_scaler *s, int finite);

#endif
