/* gpu_sdpa.h: cuDNN's attention graphs (gpu/gpu_sdpa.cu, built with --with-cudnn) compiled ahead of
 * time for a device that need not be present: for the tests, which check without a GPU that the
 * graphs greenlm asks for build for the GPUs it targets. C and C++. */
#ifndef GREENLM_GPU_SDPA_H
#define GREENLM_GPU_SDPA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether cuDNN builds the forward (bwd = 0) or backward (1) attention graph at storage type
 * `storage` (BACKEND_BF16 or BACKEND_FP16) for qkv (B,T,C+2Ckv) with H heads and Hkv key/value heads, window (<= 0: global) and
 * scale on the device that device_json describes (cuDNN's device-properties JSON: SM count, shared
 * memory, ...) of compute capability sm (90 for 9.0): the graph is validated and lowered, and the
 * engine configurations cuDNN's heuristics choose are checked for that device (the plans, whose
 * kernels load on the device, are not built). 0, with *deterministic whether the backward found is
 * the deterministic one; or -1 with cuDNN's reason in why. Needs libcuda.so.1 (the toolkit's stub
 * will do where there is no driver). */
int gpu_sdpa_aot(const char *device_json, int sm, int bwd, int storage, int B, int T, int C, int H, int Hkv,
                 int window, float scale, int *deterministic, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif
