/* optim: learning-rate schedule, global-norm clipping and AdamW over the model's tensors.
 *
 * AdamW follows PyTorch's torch.optim.AdamW: decoupled weight decay p -= lr*wd*p, bias-corrected
 * moments. Weight decay applies to weight matrices and embeddings (gpt_tensor.decay), never to
 * biases or LayerNorm parameters. Clipping follows torch.nn.utils.clip_grad_norm_: gradients are
 * scaled by min(1, clip / (norm + 1e-6)). */
#ifndef GREENLM_OPTIM_H
#define GREENLM_OPTIM_H

#include "cfg.h"
#include "model.h"

/* Learning rate at 0-based step: linear warm-up to lr over warmup_steps, then decay
 * (cosine, linear or constant) to min_lr at decay_steps, min_lr afterwards. */
double optim_lr(const cfg_training *t, long step);

/* Sum of squares of this rank's gradients (callers reduce it across ranks where needed). */
double optim_grad_sumsq(const gpt_model *m);

/* Clip factor for a global gradient norm (1 when clipping is off or not needed). */
double optim_clip_scale(const cfg_training *t, double grad_norm);

/* One AdamW step at 0-based `step` with the learning rate lr; gradients scaled by grad_scale. */
void optim_adamw_step(gpt_model *m, const cfg_training *t, long step, double lr, double grad_scale);

#endif
