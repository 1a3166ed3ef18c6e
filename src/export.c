/* export: the 'export' task. */
#include "export.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "infer.h"
#include "io/hf.h"

void export_dir(const cfg_config *cfg, char *dir, size_t len) {
  if (cfg->export.dir[0]) util_strlcpy(dir, cfg->export.dir, len);
  else util_snprintf(dir, len, "%s/hf", cfg->job.run_dir);
}

int export_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs) {
  infer_model im;
  if (infer_open(&im, cfg, be, comm, errs)) return 1;
  if (infer_load(&im, 1, 1, errs)) {
    infer_close(&im);
    return 1;
  }
  char dir[CFG_STR_LEN + 8];
  export_dir(cfg, dir, sizeof dir);
  int bad = 0;
  if (im.rank == 0) {
    double t0 = util_now();
    float *owned;
    const float *params = infer_host_params(&im, &owned);
    long n0 = err_count(errs);
    hf_export(dir, &im.shape, params, &cfg->model, &cfg->tokenizer, &cfg->sample, cfg->export.dtype, cfg->export.shard_mb,
              cfg->job.overwrite, errs);
    bad = err_count(errs) > n0;
    free(owned);
    char b[32];
    if (!bad)
      printf("export: %s written from the %s: %zu parameters in %s (%s) in %.2f s\n", dir, im.source, im.model.nparams,
             cfg->export.dtype, util_fmt_bytes((double)im.model.nparams * (double)backend_dtype_size(backend_precision_storage(cfg->export.dtype)), b, sizeof b),
             util_now() - t0);
    fflush(stdout);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  infer_close(&im);
  return bad;
}
