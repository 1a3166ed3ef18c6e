/* test_sdpa_aot: the cuDNN attention graphs greenlm asks for (gpu/gpu_sdpa.cu), built ahead of time
 * for the GPUs it targets, without a GPU: each graph is validated and lowered by cuDNN, and the
 * engine configurations its heuristics choose are checked (and compiled) for the device described.
 *
 *   H100/H200 (sm_90) and A100 (sm_80): the forward and the deterministic backward of GPT-Neo 125M,
 *     1.3B and 2.7B at T = 2048, global and local (window 256) layers, bf16 and fp16 storage, at
 *     GPT-Neo's scale 1 and GPT-2's 1/sqrt(d), are supported;
 *   V100 (sm_70): declined (its path is greenlm's fp16 WMMA kernels);
 *   greenlm's own rule declines head sizes that are not multiples of 8 (those run in its kernels);
 *   a bad device description is an error with cuDNN's reason;
 * and the parity program's attention shapes are listed with the path each takes on an H200.
 *
 * cuDNN compiles engines through the driver library: libcuda.so.1, or the toolkit's stub of it
 * where there is no driver (loaded here first, under the same name). Without a build configured
 * with cuDNN, or without either library, it prints SKIP and exits 77. */
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "base/util.h"
#include "model/backend.h"
#include "testing.h"

#ifdef GREENLM_HAVE_CUDNN
#include "gpu_sdpa.h"

typedef struct {
  const char *name;
  int sm, sms, smem_optin, l2_mb;
} gpu_desc;

static const gpu_desc H200 = {"NVIDIA H200", 90, 132, 232448, 50}, A100 = {"NVIDIA A100-SXM4-80GB", 80, 108, 166912, 40},
                      V100 = {"Tesla V100-SXM2-32GB", 70, 80, 98304, 6};

/* cuDNN's device-properties JSON for g */
static const char *device_json(const gpu_desc *g, char *buf, size_t len) {
  util_snprintf(buf, len,
                "{\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": [1024, 1024, 64], "
                "\"regsPerBlock\": 65536, \"multiProcessorCount\": %d, \"warpSize\": 32, "
                "\"maxSharedMemoryPerBlock\": 49152, \"maxSharedMemoryPerBlockOptin\": %d, "
                "\"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": 65536, \"maxCtasPerSM\": 32, "
                "\"maxThreadsPerBlock\": 1024, \"maxThreadsPerSM\": 2048, \"pciDeviceId\": 0, \"isTccDriver\": 0, "
                "\"supportCoopLaunch\": 1, \"smClockRateKHz\": 1500000, \"memClockRateKHz\": 1500000, "
                "\"l2CacheSize\": %d, \"deviceName\": \"%s\", \"totalGlobalMem\": 85899345920, \"cudaDeviceId\": 0, "
                "\"deviceVer\": %d, \"driverVer\": 13000}",
                g->sms, g->smem_optin, g->l2_mb << 20, g->name, 10 * g->sm);
  return buf;
}

typedef struct {
  const char *name;
  int B, C, H, Hkv;
} model;
static const model MODELS[] = {{"GPT-Neo 125M", 8, 768, 12, 12},
                               {"GPT-Neo 1.3B", 4, 2048, 16, 16},
                               {"GPT-Neo 2.7B", 2, 2560, 20, 20},
                               {"Llama 3 8B (grouped-query, 8 key/value heads of 32)", 1, 4096, 32, 8}};

/* One graph on g: 0 (supported, *det) or -1 (declined, why). */
static int aot(const gpu_desc *g, int bwd, backend_dtype t, int B, int T, int C, int H, int Hkv, int window, float scale,
               int *det, char *why, size_t len) {
  char js[1024];
  *det = -1;
  why[0] = '\0';
  return gpu_sdpa_aot(device_json(g, js, sizeof js), g->sm, bwd, (int)t, B, T, C, H, Hkv, window, scale, det, why, len);
}

/* GPT-Neo's shapes on a device that must take them all, deterministic backward included */
static void test_supported(const gpu_desc *g) {
  for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++)
    for (int t = BACKEND_BF16; t <= BACKEND_FP16; t++)
      for (int window = 0; window <= 256; window += 256)
        for (int gpt2 = 0; gpt2 <= 1; gpt2++)
          for (int bwd = 0; bwd <= 1; bwd++) {
            const model *x = &MODELS[m];
            float scale = gpt2 ? 1.0f / sqrtf((float)(x->C / x->H)) : 1.0f;
            int det;
            char why[512];
            int rc = aot(g, bwd, (backend_dtype)t, x->B, 2048, x->C, x->H, x->Hkv, window, scale, &det, why, sizeof why);
            T_CHECK(rc == 0 && det == 1, "%s, %s %s %s storage, window %d, scale %g: %s%s", g->name, x->name,
                    bwd ? "backward" : "forward", backend_dtype_name((backend_dtype)t), window, scale,
                    rc ? "declined: " : "not the deterministic algorithm", why);
          }
  printf("%s: GPT-Neo 125M, 1.3B, 2.7B and Llama 3 8B's grouped-query attention at T = 2048 (global and local "
         "layers, bf16 and fp16, forward and deterministic backward) build in cuDNN\n",
         g->name);
}

static void test_declined(void) {
  int det;
  char why[512];
  for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
    const model *x = &MODELS[m];
    int rc = aot(&V100, 0, BACKEND_FP16, x->B, 2048, x->C, x->H, x->Hkv, 0, 1.0f, &det, why, sizeof why);
    T_CHECK(rc == -1 && why[0], "%s, %s: cuDNN took the attention (greenlm's WMMA kernels are the V100 path)",
            V100.name, x->name);
  }
  printf("%s: declined (%s): greenlm's fp16 WMMA kernels\n", V100.name, why);
  int rc = aot(&H200, 0, BACKEND_BF16, 2, 64, 40, 2, 2, 0, 1.0f, &det, why, sizeof why);
  T_CHECK(rc == -1 && strstr(why, "multiple of 8"), "head size 20 was not declined by greenlm's rule: %s", why);
  rc = gpu_sdpa_aot("{\"multiProcessorCount\": 1}", 90, 0, BACKEND_BF16, 2, 64, 64, 2, 2, 0, 1.0f, &det, why, sizeof why);
  T_CHECK(rc == -1 && strstr(why, "device description"), "a bad device description was taken: %s", why);
}

/* the parity program's shapes (tests/test_gpu_parity.c): which path each takes on an H200 */
static void list_parity(void) {
  static const int shapes[][6] = {
      {2, 37, 64, 4, 4, 0},    {1, 100, 128, 2, 2, 0},  {2, 77, 96, 3, 3, 16},    {1, 300, 256, 2, 2, 64},
      {2, 129, 256, 2, 2, 0},  {1, 50, 512, 2, 2, 0},   {2, 33, 40, 2, 2, 1},     {1, 1, 64, 2, 2, 0},
      {3, 150, 128, 2, 2, 24}, {2, 211, 256, 2, 2, 100}, {1, 65, 128, 2, 2, 1},   {2, 1, 512, 4, 4, 0},
      {2, 90, 96, 2, 2, 20},   {1, 200, 192, 2, 2, 0},  {1, 520, 128, 2, 2, 0},   {2, 100, 512, 8, 2, 0},
      {1, 77, 256, 8, 1, 0},   {1, 150, 512, 4, 2, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *s = shapes[i];
    int df, db;
    char wf[512], wb[512];
    int f = aot(&H200, 0, BACKEND_BF16, s[0], s[1], s[2], s[3], s[4], s[5], 1.0f, &df, wf, sizeof wf);
    int b = aot(&H200, 1, BACKEND_BF16, s[0], s[1], s[2], s[3], s[4], s[5], 1.0f, &db, wb, sizeof wb);
    printf("  parity shape B=%d T=%d C=%d H=%d Hkv=%d window %d on %s: forward %s, backward %s%s%s\n", s[0], s[1], s[2],
           s[3], s[4], s[5], H200.name, f ? "greenlm's kernels" : "cuDNN", b ? "greenlm's kernels" : "cuDNN",
           b ? " — " : "", b ? wb : "");
  }
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *why = NULL;
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
#ifdef GREENLM_CUDA_STUB
    if (!dlopen(GREENLM_CUDA_STUB, RTLD_NOW | RTLD_GLOBAL)) why = "neither libcuda.so.1 nor the toolkit's stub loads";
#else
    why = "no libcuda.so.1, and the toolkit has no stub of it";
#endif
  }
  if (why) {
    printf("SKIP: %s\n", why);
    MPI_Finalize();
    return 77;
  }
  test_supported(&H200);
  test_supported(&A100);
  test_declined();
  list_parity();
  int rc = t_done("test_sdpa_aot");
  MPI_Finalize();
  return rc;
}

#else /* a build without cuDNN */

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  printf("SKIP: this build has no cuDNN attention (configure --with-cuda --with-cudnn)\n");
  MPI_Finalize();
  return 77;
}

#endif
