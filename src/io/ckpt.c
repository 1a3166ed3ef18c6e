/* ckpt: collective PnetCDF checkpoint writing and reading, with layout-free checksums. */
#define _GNU_SOURCE /* sync_file_range, where there is one */
#include "io/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "base/env.h"
#include "base/ncfile.h"
#include "base/progress.h"
#include "base/util.h"
#include "parallel/grad.h"
#include "parallel/psgd.h"
#include "io/rdahead.h"
#include "text/fileid.h"

#define CKPT_FORMAT "greenlm checkpoint"
#define CKPT_VERSION 2

static const char *const KIND_PREFIX[3] = {"", "adam_m.", "adam_v."};
static const char CKPT_WRITE_HINT[] = "check that &checkpoint dir is writable and has room; the older checkpoints are untouched";

void ckpt_dir(const cfg_config *cfg, char *dir, size_t len) {
  if (cfg->checkpoint.dir[0])
    util_snprintf(dir, len, "%s", cfg->checkpoint.dir);
  else
    util_snprintf(dir, len, "%s/checkpoints", cfg->job.run_dir);
}

/* ---- which elements this rank owns ------------------------------------------------------------ */

/* One piece of a tensor: elements [a, b) of whole-model tensor `t`, at `off` in the stage buffer. */
typedef struct {
  int t;       /* index in the whole model's tensor list */
  size_t a, b; /* flat range within the tensor */
  size_t off;  /* stage-buffer offset of element a */
  int counted; /* 0 for the last stage's copy of the tied embedding (the first stage's counts) */
} ckpt_piece;

/* The pieces of [lo, hi) of the stage buffer, tensor by tensor, each contiguous in the buffer and in the
 * whole tensor (a tensor-parallel shard's rows or row pieces). Not counted: the last stage's copy of the
 * tied embedding, and on tensor ranks other than 0 the tensors every tensor rank holds. Returns the
 * count; *out to free(). */
static int pieces_of(const gpt_model *m, const par_layout *lay, size_t lo, size_t hi, ckpt_piece **out) {
  size_t cap = (size_t)m->ntensors + 1;
  ckpt_piece *p = util_malloc(cap * sizeof *p, "pieces");
  int n = 0;
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    int copy = lay->P > 1 && lay->stage == lay->P - 1 && t->tied;
    int counted = !copy && gpt_tensor_owned(m, t);
    size_t a = lo > t->offset ? lo : t->offset, b = hi < t->offset + t->numel ? hi : t->offset + t->numel;
    for (size_t e = a - t->offset, run; a < b; a += run, e += run) {
      size_t g = gpt_tensor_global(t, e, &run);
      run = run < b - a ? run : b - a;
      if ((size_t)n == cap) p = util_realloc(p, (cap *= 2) * sizeof *p, "pieces");
      p[n++] = (ckpt_piece){t->index, g, g + run, a, counted};
    }
  }
  *out = p;
  return n;
}

/* This replica's piece of the stage buffer: what it writes, and reads before sharing it. */
static void own_piece(const gpt_model *m, const par_layout *lay, size_t *lo, size_t *hi) {
  *lo = par_piece(m->nparams, lay->D, lay->replica);
  *hi = par_piece(m->nparams, lay->D, lay->replica + 1);
}

/* One element's part of a variable's checksum: its bits times an odd weight per position (2i + 1),
 * modulo 2^64, so that any changed, swapped or zeroed element changes the sum (doc/formats.md). */
static inline uint64_t checksum_term(uint32_t bits, size_t i) { return (uint64_t)bits * (2 * (uint64_t)i + 1); }

/* Checksum contribution of elements [a, b) of a variable, their values x (host); copied to y on
 * the way unless y is NULL. */
static uint64_t checksum_part(float *restrict y, const float *restrict x, size_t a, size_t b) {
  uint64_t s = 0;
  for (size_t i = a; i < b; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i - a], sizeof bits);
    if (y) memcpy(&y[i - a], &bits, sizeof bits);
    s += checksum_term(bits, i);
  }
  return s;
}

/* The same sum over elements [a, b) as they lie in the file (big-endian IEEE 754 bytes, raw),
 * converted to host floats on the way into y unless y is NULL: the read side's one pass. *nonfinite
 * receives the first element that is a NaN or an infinity, if one is and *nonfinite is SIZE_MAX. */
static uint64_t checksum_from_file(float *y, const unsigned char *raw, size_t a, size_t b, /* y may be raw */
                                   size_t *nonfinite) {
  uint64_t s = 0;
  for (size_t i = a; i < b; i++) {
    const unsigned char *q = raw + 4 * (i - a);
    uint32_t bits = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | (uint32_t)q[3];
    if (y) memcpy(&y[i - a], &bits, sizeof bits);
    s += checksum_term(bits, i);
    if ((bits & 0x7f800000u) == 0x7f800000u && *nonfinite == SIZE_MAX) *nonfinite = i; /* exponent all ones */
  }
  return s;
}

/* Kinds of stage buffer a read fills: the parameters and their AdamW moments (3), or the parameters
 * only (1: a model read for eval, sample or export, without an optimizer). */
static int kinds(const ckpt_state *s) { return s->opt ? 3 : 1; }

/* Backend address of stage-buffer element `off` of kind k (0 params, 1 adam_m, 2 adam_v). */
static float *addr(const ckpt_state *s, int k, size_t off) {
  return k == 0 ? s->model->params + off : (k == 1 ? s->opt->m : s->opt->v) + (off - s->opt->lo);
}

/* ---- staged I/O: every element passes once through a small host buffer ------------------------- */

/* Writes: tensors go to the file through a host buffer of &checkpoint stage_mb (8 MiB) that stays
 * in the processor's cache: copied from the backend (checksummed on the way), posted as
 * non-blocking puts (PnetCDF swaps the bytes to big-endian in place), written by one collective
 * wait per batch, far below PnetCDF 1.12's 2 GiB per wait. Ranks whose pieces differ in size need
 * different numbers of waits: each wait is preceded by an agreement (an MPI_Allreduce of "this
 * rank has data to write now"), and a rank that has written everything keeps taking part with
 * empty waits until no rank has data left (io_close). Each rank keeps a descriptor of its own to
 * the file, to ask the kernel after every batch to start writing it to the disk (so the final
 * sync finds little left to do).
 *
 * Reads: the header and the variables' places come from PnetCDF (ncmpi_open,
 * ncmpi_inq_varoffset); a CDF-5 fixed-size variable is one contiguous run of big-endian floats.
 * Each rank announces its runs in order (io_expect), reader threads of its own read them ahead,
 * read_requests at a time, in requests of &checkpoint read_mb covering as many runs as fit
 * (rdahead: straight from the disk with direct_read, so no page cache and no kernel copy), and
 * the rank converts, checksums
 * and copies them to the backend in one pass, batch by batch of stage_mb (in place in the
 * reader's buffer, then to the device, for device memory). The conversion overlaps the disk, and
 * the GPU backend needs no host copy of the model. */

typedef struct {
  float *dst;     /* read: backend address the elements go to */
  size_t a, n;    /* elements [a, a + n) of the variable */
  int sum;        /* index into sums, or -1 when not counted */
  MPI_Offset off; /* read: file offset of element a */
} io_seg;

typedef struct {
  int nc, write;
  const backend *be;
  float *stage;
  size_t cap, used; /* elements */
  io_seg *seg;
  int nseg, segcap;
  int *req, *st;
  int nreq, reqcap;
  uint64_t *sums; /* checksums of what passed, per variable (3 per tensor) */
  int rc;
  MPI_Comm comm;        /* the ranks writing or reading the file together */
  int fd;               /* this rank's own descriptor of the file, or -1 */
  void (*poll)(void *); /* read: called after each batch (sharing's progress), or NULL */
  void *poll_arg;
  rdahead_extent *ext;  /* read: the extents to come, in the order they are read */
  int nexp, expcap;     /* ext[0, nexp) announced */
  rdahead *ra;          /* read: the reader threads, once started (io_start) */
  int direct;           /* read: the file was read straight from the disk (known at io_close) */
  int host;             /* the memory the elements come from or go to is host memory, whatever the backend's */
  MPI_Offset nonfinite; /* read: file offset of the first NaN or infinity read, or -1 */
} io_stream;

/* Whether the stream's elements come from or go to host memory. */
static int host_side(const io_stream *io) { return io->host || io->be->caps.host_memory; }

/* Elements in the staging buffer: &checkpoint stage_mb, at least one. */
static size_t stage_elems(const ckpt_state *s) {
  size_t n = (size_t)(s->cfg->checkpoint.stage_mb * (1 << 20)) / sizeof(float);
  return n ? n : 1;
}

static void io_open(io_stream *io, int nc, int write, const ckpt_state *s, uint64_t *sums, int nsums, const char *path,
                    MPI_Comm comm) {
  *io = (io_stream){.nc = nc, .write = write, .be = s->model->be, .sums = sums, .cap = stage_elems(s), .comm = comm,
                    .nonfinite = -1};
  if (write) io->stage = util_malloc(io->cap * sizeof(float), "checkpoint staging");
  io->fd = open(path, O_RDONLY);
  memset(sums, 0, (size_t)nsums * sizeof *sums);
}

/* Read: elements [a, b) of var will be read, after those announced before. */
static void io_expect(io_stream *io, int var, size_t a, size_t b) {
  MPI_Offset off;
  if (io->fd < 0 || ncmpi_inq_varoffset(io->nc, var, &off) != NC_NOERR) return;
  if (io->nexp == io->expcap) {
    io->expcap = io->expcap ? 2 * io->expcap : 256;
    io->ext = util_realloc(io->ext, (size_t)io->expcap * sizeof *io->ext, "extents");
  }
  io->ext[io->nexp++] = (rdahead_extent){off + (MPI_Offset)(a * sizeof(float)), (MPI_Offset)((b - a) * sizeof(float))};
}

/* Read: every extent announced; the reader threads start on them (&checkpoint read_mb, read_requests, direct_read). */
static void io_start(io_stream *io, const char *path, const cfg_checkpoint *ck) {
  io->ra = rdahead_open(path, io->ext, io->nexp, (size_t)(ck->read_mb * (1 << 20)), ck->read_requests, ck->direct_read);
}

/* Writes: the agreement, then (where any rank has data: `more` says whether this one has) one
 * collective wait for what is posted; returns whether the wait took place. Reads: each segment's
 * bytes as the reader delivers them, converted, checksummed and copied to the backend in one pass
 * (no collectives); returns 0. */
static int io_flush(io_stream *io, int more) {
  int rc = NC_NOERR, any = 0;
  progress_mark();
  if (io->write) {
    MPI_Allreduce(&more, &any, 1, MPI_INT, MPI_LOR, io->comm);
    if (!any) return 0;
    rc = ncmpi_wait_all(io->nc, io->nreq, io->req, io->st);
    for (int i = 0; i < io->nreq && rc == NC_NOERR; i++) rc = io->st[i];
  }
  for (int i = 0; i < io->nseg && rc == NC_NOERR; i++) {
    io_seg *g = &io->seg[i];
    for (size_t done = 0; done < g->n && rc == NC_NOERR;) { /* elements */
      size_t got = 0;
      MPI_Offset at = g->off + (MPI_Offset)(done * sizeof(float));
      unsigned char *raw = io->ra ? rdahead_take(io->ra, at, (g->n - done) * sizeof(float), &got) : NULL;
      if (!raw || got % sizeof(float)) {
        rc = NC_EREAD; /* the file ends early (truncated) or cannot be read */
        break;
      }
      size_t k = got / sizeof(float);
      float *host = host_side(io) ? g->dst + done : (float *)raw; /* in place for devices */
      size_t bad = SIZE_MAX;
      uint64_t s = checksum_from_file(host, raw, g->a + done, g->a + done + k, &bad); /* converted and summed in one pass */
      if (g->sum >= 0) io->sums[g->sum] += s;
      if (bad != SIZE_MAX && io->nonfinite < 0) io->nonfinite = g->off + (MPI_Offset)((bad - g->a) * sizeof(float));
      if (!host_side(io)) io->be->to_device(io->be, g->dst + done, host, got);
      done += k;
    }
  }
  if (rc != NC_NOERR && io->rc == NC_NOERR) io->rc = rc;
  if (!io->write && io->poll) io->poll(io->poll_arg);
#ifdef SYNC_FILE_RANGE_WRITE
  if (io->write && io->fd >= 0 && io->nreq) sync_file_range(io->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
  io->nreq = io->nseg = 0;
  io->used = 0;
  return any;
}

/* Write: post elements [x, x + n) of var from buf as a non-blocking put (a hyperslab). */
static void io_post(io_stream *io, int var, int cols, size_t x, size_t n, float *buf) {
  MPI_Offset start[2], count[2];
  if (cols <= 1) {
    start[0] = (MPI_Offset)x, count[0] = (MPI_Offset)n;
  } else {
    start[0] = (MPI_Offset)(x / (size_t)cols), start[1] = (MPI_Offset)(x % (size_t)cols);
    count[0] = (MPI_Offset)(n / (size_t)cols), count[1] = cols;
    if (n < (size_t)cols || x % (size_t)cols) count[0] = 1, count[1] = (MPI_Offset)n;
  }
  if (io->nreq == io->reqcap) {
    io->reqcap = io->reqcap ? 2 * io->reqcap : 256;
    io->req = util_realloc(io->req, (size_t)io->reqcap * sizeof(int), "requests");
    io->st = util_realloc(io->st, (size_t)io->reqcap * sizeof(int), "statuses");
  }
  int rc = ncmpi_iput_vara_float(io->nc, var, start, count, buf, &io->req[io->nreq]);
  if (rc == NC_NOERR) io->nreq++;
  else if (io->rc == NC_NOERR) io->rc = rc;
}

/* Elements [a, b) of variable var (rows, cols, row-major) from or to backend memory at x, as
 * hyperslabs (a partial first row, whole rows, a partial last row), counted in checksum `sum`
 * (-1: not counted). Reads go in the order io_expect announced them. */
static void io_range(io_stream *io, int var, int cols, size_t a, size_t b, float *x, int sum) {
  size_t c = cols > 1 ? (size_t)cols : 0;
  MPI_Offset var_off = 0; /* reads go straight to the variable's bytes (CDF-5: contiguous, big-endian) */
  if (!io->write && (io->fd < 0 || ncmpi_inq_varoffset(io->nc, var, &var_off) != NC_NOERR)) {
    if (io->rc == NC_NOERR) io->rc = NC_EREAD;
    return;
  }
  while (a < b) {
    if (io->used == io->cap) io_flush(io, 1);
    size_t n = b - a < io->cap - io->used ? b - a : io->cap - io->used;
    if (c && a % c) n = n < c - a % c ? n : c - a % c; /* up to the end of a partial row */
    else if (c && n >= c) n -= n % c;                   /* whole rows */
    if (io->write) {
      float *buf = io->stage + io->used;
      if (host_side(io) && sum >= 0) {
        io->sums[sum] += checksum_part(buf, x, a, a + n); /* copied and summed in one pass */
      } else {
        if (host_side(io)) memcpy(buf, x, n * sizeof(float));
        else io->be->to_host(io->be, buf, x, n * sizeof(float));
        if (sum >= 0) io->sums[sum] += checksum_part(NULL, buf, a, a + n);
      }
      io_post(io, var, cols, a, n, buf);
    } else {
      if (io->nseg == io->segcap) {
        io->segcap = io->segcap ? 2 * io->segcap : 256;
        io->seg = util_realloc(io->seg, (size_t)io->segcap * sizeof *io->seg, "segments");
      }
      io->seg[io->nseg++] = (io_seg){x, a, n, sum, var_off + (MPI_Offset)(a * sizeof(float))};
    }
    io->used += n, a += n, x += n;
  }
}

/* Rank 0 reserves the whole file's blocks (extent bytes) before the ranks write their pieces at
 * once, so the file system lays it out in one run rather than interleaving the writers' extents
 * (which made reading a piece back slower than reading a file written by one writer). Where the
 * file system cannot (posix_fallocate fails), nothing changes. */
static void reserve(const char *path, MPI_Offset extent, MPI_Comm comm) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    int fd = open(path, O_WRONLY);
    if (fd >= 0) posix_fallocate(fd, 0, (off_t)extent), close(fd);
  }
  MPI_Barrier(comm);
}

/* What stood between a checkpoint of `extent` bytes at path and the disk, into buf: the file-size
 * limit of the process, or the free space of the file system that holds it (measured after the
 * failed file is gone); "" when neither explains it. */
static const char *room_note(const char *path, MPI_Offset extent, char *buf, size_t len) {
  char dir[CKPT_PATH_MAX], need[32], have[32];
  fileid_dirname(path, dir, sizeof dir);
  struct rlimit rl;
  struct statvfs vs;
  util_fmt_bytes((double)extent, need, sizeof need);
  buf[0] = '\0';
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (MPI_Offset)rl.rlim_cur < extent)
    util_snprintf(buf, len, ": the checkpoint needs %s (%lld bytes), above the process's file-size limit of %s (ulimit -f)",
                  need, (long long)extent, util_fmt_bytes((double)rl.rlim_cur, have, sizeof have));
  else if (statvfs(dir, &vs) == 0 && (double)vs.f_bavail * (double)vs.f_frsize < (double)extent)
    util_snprintf(buf, len, ": the checkpoint needs %s (%lld bytes) and the file system holding %s has %s free", need,
                  (long long)extent, dir, util_fmt_bytes((double)vs.f_bavail * (double)vs.f_frsize, have, sizeof have));
  return buf;
}

/* GREENLM_CHECKPOINT_PAUSE: a test's moment to kill the job inside this write (its .tmp exists). */
static void rehearse_pause(void) {
  long long ms = env_checkpoint_pause_ms();
  if (ms > 0) nanosleep(&(struct timespec){(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L}, NULL);
}

/* Rank 0: whether the closed file at path is shorter than extent, as when a write failed without
 * the MPI-IO layer reporting it (Open MPI 4.1's OMPIO prints "error in writev" and returns
 * success); then errs says so. */
static int short_file(const char *path, MPI_Offset extent, MPI_Comm comm, err_list *errs) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  struct stat sb;
  if (rank != 0 || stat(path, &sb) != 0 || (MPI_Offset)sb.st_size >= extent) return 0;
  char room[512];
  err_add(errs, path, 0, 0, CKPT_WRITE_HINT,
          "writing the checkpoint failed: the file has %lld of its %lld bytes after every write reported "
          "success (a full disk or a file-size limit that the MPI-IO layer did not report)%s",
          (long long)sb.st_size, (long long)extent, room_note(path, extent, room, sizeof room));
  return 1;
}

/* Writes: this rank's last wait, then empty ones while other ranks still write. Reads: the last
 * segments. */
static void io_close(io_stream *io) {
  if (io->write)
    while (io_flush(io, io->nreq > 0)) continue;
  else
    io_flush(io, 0);
  if (io->ra) io->direct = rdahead_direct(io->ra);
  rdahead_close(io->ra);
  io->ra = NULL;
  free(io->stage), free(io->seg), free(io->req), free(io->st), free(io->ext);
}

/* After the file is synced (or read): its pages leave the page cache, which they would otherwise
 * fill at the cost of the training data's (a checkpoint is read once, on restart). */
static void io_release(io_stream *io) {
  if (io->fd < 0) return;
  posix_fadvise(io->fd, 0, 0, POSIX_FADV_DONTNEED);
  close(io->fd);
  io->fd = -1;
}

/* Each replica's piece of the stage buffer of kind k to every replica of the stage: broadcasts
 * over the data-parallel communicator, in place on host memory, through a host buffer otherwise. */
static void share_pieces(const ckpt_state *s, int k) {
  const par_layout *lay = s->lay;
  const backend *be = s->model->be;
  size_t n = s->model->nparams, cap = be->caps.host_memory ? (size_t)1 << 28 : stage_elems(s);
  if (cap > (size_t)1 << 28) cap = (size_t)1 << 28; /* MPI counts are ints: a large &checkpoint stage_mb goes in chunks */
  float *stage = be->caps.host_memory ? NULL : util_malloc(cap * sizeof(float), "checkpoint staging");
  for (int r = 0; r < lay->D; r++) {
    size_t lo = par_piece(n, lay->D, r), hi = par_piece(n, lay->D, r + 1);
    for (size_t a = lo; a < hi; a += cap) {
      size_t c = hi - a < cap ? hi - a : cap;
      float *x = addr(s, k, a);
      if (stage && lay->replica == r) be->to_host(be, stage, x, c * sizeof(float));
      MPI_Bcast(stage ? stage : x, (int)c, MPI_FLOAT, r, lay->dp);
      if (stage && lay->replica != r) be->to_device(be, x, stage, c * sizeof(float));
    }
  }
  free(stage);
}

/* The same, overlapped with the reading (backends in host memory): each replica's piece goes out in
 * chunks of SHARE_CHUNK elements as non-blocking broadcasts, posted in one order on every rank of
 * the data-parallel communicator: chunk c of kind k of replica r, for c, then k, then r. A rank
 * posts the chunks it receives at once and those it sends as soon as its reading has passed them
 * (share_post), and drives the posted ones on after each batch it reads (share_poll). So the
 * replicas exchange their pieces while the file is still being read. */
enum { SHARE_CHUNK = 1 << 22 };

typedef struct {
  const ckpt_state *s;
  int nk;              /* kinds shared: 1 (the parameters; ZeRO-1 keeps the moments apart) or 3 */
  size_t next, total;  /* chunks posted, chunks in all */
  MPI_Request *req;    /* (total) */
} sharer;

static void share_open(sharer *h, const ckpt_state *s) {
  const par_layout *lay = s->lay;
  size_t most = par_piece(s->model->nparams, lay->D, 1) + 1; /* pieces differ by one element at most */
  *h = (sharer){.s = s, .nk = lay->zero ? 1 : kinds(s)};
  h->total = (most + SHARE_CHUNK - 1) / SHARE_CHUNK * (size_t)h->nk * (size_t)lay->D;
  h->req = util_malloc((h->total ? h->total : 1) * sizeof *h->req, "requests");
}

/* Post chunks in order, up to the first one this rank sends beyond `landed` (its piece is read up to
 * that stage-buffer offset). */
static void share_post(sharer *h, size_t landed) {
  const par_layout *lay = h->s->lay;
  size_t n = h->s->model->nparams;
  while (h->next < h->total) {
    size_t x = h->next, chunk = x / ((size_t)lay->D * (size_t)h->nk);
    int r = (int)(x % (size_t)lay->D), k = (int)(x / (size_t)lay->D % (size_t)h->nk);
    size_t a = par_piece(n, lay->D, r) + chunk * SHARE_CHUNK, hi = par_piece(n, lay->D, r + 1);
    size_t c = a < hi ? (hi - a < SHARE_CHUNK ? hi - a : SHARE_CHUNK) : 0;
    if (c && r == lay->replica && a + c > landed) break;
    h->req[h->next++] = MPI_REQUEST_NULL;
    if (c) MPI_Ibcast(addr(h->s, k, a), (int)c, MPI_FLOAT, r, lay->dp, &h->req[h->next - 1]);
  }
}

static void share_poll(void *arg) {
  sharer *h = arg;
  for (size_t i = 0; i < h->next; i++) { /* MPI_Test one by one: GCC 12 misreads MPICH's MPI_STATUSES_IGNORE */
    int done;
    if (h->req[i] != MPI_REQUEST_NULL) MPI_Test(&h->req[i], &done, MPI_STATUS_IGNORE);
  }
}

/* The rest: every chunk posted, all complete. */
static void share_close(sharer *h) {
  share_post(h, SIZE_MAX);
  for (size_t i = 0; i < h->next; i++) MPI_Wait(&h->req[i], MPI_STATUS_IGNORE);
  free(h->req);
}

/* MPI-IO hints. Each rank writes large contiguous runs of its own; ROMIO may decide per call
 * whether to aggregate them (two-phase collective buffering, 'automatic'). Reads of the
 * header go directly (the data is read with pread, above). Data sieving, which turns runs into
 * read-modify-write cycles through a small buffer, is off. PNETCDF_HINTS in the environment still
 * overrides these. */
static MPI_Info io_hints(void) {
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "romio_cb_read", "disable");
  MPI_Info_set(info, "romio_cb_write", "automatic");
  MPI_Info_set(info, "romio_ds_read", "disable");
  MPI_Info_set(info, "romio_ds_write", "disable");
  return info;
}

/* ---- the file's header -------------------------------------------------------------------------- */

static int put_text(int nc, int var, const char *name, const char *v) {
  return ncmpi_put_att_text(nc, var, name, (MPI_Offset)strlen(v), v);
}

static int put_i64(int nc, const char *name, long long v) {
  return ncmpi_put_att_longlong(nc, NC_GLOBAL, name, NC_INT64, 1, &v);
}

static int put_f64(int nc, const char *name, double v) { return ncmpi_put_att_double(nc, NC_GLOBAL, name, NC_DOUBLE, 1, &v); }

/* The model-shape attributes, written and checked alike. */
typedef struct {
  const char *name;
  long long value;
} shape_attr;

static int shape_attrs(const cfg_config *cfg, shape_attr *a) {
  const cfg_model *m = &cfg->model;
  int n = 0;
  a[n++] = (shape_attr){"vocab_size", m->vocab_size};
  a[n++] = (shape_attr){"block_size", m->block_size};
  a[n++] = (shape_attr){"n_layer", m->n_layer};
  a[n++] = (shape_attr){"n_embd", m->n_embd};
  a[n++] = (shape_attr){"n_head", m->n_head};
  a[n++] = (shape_attr){"n_inner", m->n_inner};
  a[n++] = (shape_attr){"window_size", m->window_size};
  if (cfg_model_arch_of(m) == CFG_ARCH_LLAMA) a[n++] = (shape_attr){"n_kv_head", cfg_kv_heads(m)}; /* its own */
  return n;
}

static void attention_pattern(const cfg_model *m, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < m->attention_types.n && o + 1 < len; i++)
    o += (size_t)util_snprintf(buf + o, len - o, "%s%s", i ? "," : "", m->attention_types.v[i]);
}

/* ---- the run state: what a restart continues from, under a checksum of its own ----------------- */

typedef struct {
  long long step, epoch, position, seed, dataset_tokens;
  long long seq_len; /* the windows the cursor counts (data_seq_len); 0 in a file written before it was kept */
  double tokens, loss_scale;
  char tokenizer_hash[32], dataset[32]; /* dataset: the training dataset's identity (data.h), hex */
  int comm_nlevels;                     /* the compressed exchange's adaptive levels, when it has them */
  float comm_levels[128];
  int nblend;                           /* a blend: windows drawn from each dataset (position: their sum) */
  long long blend[CFG_LIST_MAX];
} run_state;

static void state_of(const ckpt_state *s, run_state *r) {
  memset(r, 0, sizeof *r);
  r->step = s->step;
  r->tokens = s->tokens;
  const data_loader *d = s->data;
  if (d && d->nsets > 1) { /* a blend: its datasets' cursors, the position their sum */
    r->nblend = d->nsets;
    for (int k = 0; k < d->nsets; k++) r->blend[k] = (long long)data_drawn(d, k);
    r->position = (long long)data_drawn_all(d);
  } else if (d) {
    r->epoch = d->set[0].epoch;
    r->position = (long long)d->set[0].pos;
  }
  r->seed = s->cfg->job.seed;
  r->seq_len = s->cfg->training.seq_len;
  r->loss_scale = s->loss_scale;
  util_strlcpy(r->tokenizer_hash, s->tokenizer_hash ? s->tokenizer_hash : "", sizeof r->tokenizer_hash);
  r->dataset_tokens = d ? data_train_tokens(d) : 0;
  r->comm_nlevels = s->comm_nlevels;
  memcpy(r->comm_levels, s->comm_levels, sizeof r->comm_levels);
  util_snprintf(r->dataset, sizeof r->dataset, "%016llx", d ? (unsigned long long)data_identity(d) : 0ULL);
}

/* FNV-1a over the fields in a fixed order (the doubles by their bits), so one flipped bit in any of
 * them is noticed. */
static uint64_t state_checksum(const run_state *r) {
  long long ints[5] = {r->step, r->epoch, r->position, r->seed, r->dataset_tokens};
  double reals[2] = {r->tokens, r->loss_scale};
  uint64_t h = util_hash64(ints, sizeof ints, 0x5ca1ab1e);
  h = util_hash64(reals, sizeof reals, h);
  h = util_hash64(r->tokenizer_hash, strlen(r->tokenizer_hash), h);
  if (r->comm_nlevels > 0) h = util_hash64(r->comm_levels, (size_t)r->comm_nlevels * sizeof(float), h);
  if (r->nblend > 0) h = util_hash64(r->blend, (size_t)r->nblend * sizeof r->blend[0], h);
  if (r->seq_len > 0) h = util_hash64(&r->seq_len, sizeof r->seq_len, h);
  return util_hash64(r->dataset, strlen(r->dataset), h);
}

static int put_state(int nc, const run_state *r) {
  char sum[32];
  util_snprintf(sum, sizeof sum, "%016llx", (unsigned long long)state_checksum(r));
  int rc = put_text(nc, NC_GLOBAL, "tokenizer_hash", r->tokenizer_hash);
  rc |= put_i64(nc, "step", r->step);
  rc |= put_f64(nc, "tokens_trained", r->tokens);
  rc |= put_i64(nc, "data_epoch", r->epoch);
  rc |= put_i64(nc, "data_position", r->position);
  rc |= put_i64(nc, "seed", r->seed);
  rc |= put_f64(nc, "loss_scale", r->loss_scale);
  rc |= put_text(nc, NC_GLOBAL, "train_dataset", r->dataset);
  rc |= put_i64(nc, "train_dataset_tokens", r->dataset_tokens);
  rc |= put_i64(nc, "data_seq_len", r->seq_len);
  if (r->comm_nlevels > 0)
    rc |= ncmpi_put_att_float(nc, NC_GLOBAL, "comm_levels", NC_FLOAT, r->comm_nlevels, r->comm_levels);
  if (r->nblend > 0)
    rc |= ncmpi_put_att_longlong(nc, NC_GLOBAL, "data_blend_windows", NC_INT64, r->nblend, r->blend);
  rc |= put_text(nc, NC_GLOBAL, "state_checksum", sum);
  return rc;
}

/* The run state as the file holds it; *sum its stored checksum ("" in format 1, which had none).
 * Returns -1 when an attribute is missing or of the wrong kind. */
static int get_state(int nc, run_state *r, char *sum, size_t len) {
  memset(r, 0, sizeof *r);
  r->loss_scale = 1;
  int bad = 0;
  bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "step", &r->step) != NC_NOERR;
  bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "data_epoch", &r->epoch) != NC_NOERR;
  bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "data_position", &r->position) != NC_NOERR;
  bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "seed", &r->seed) != NC_NOERR;
  bad |= ncmpi_get_att_double(nc, NC_GLOBAL, "tokens_trained", &r->tokens) != NC_NOERR;
  bad |= ncmpi_get_att_double(nc, NC_GLOBAL, "loss_scale", &r->loss_scale) != NC_NOERR;
  ncfile_get_text(nc, -1, "tokenizer_hash", r->tokenizer_hash, sizeof r->tokenizer_hash);
  ncfile_get_text(nc, -1, "train_dataset", r->dataset, sizeof r->dataset);
  ncfile_get_text(nc, -1, "state_checksum", sum, len);
  if (sum[0]) bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "train_dataset_tokens", &r->dataset_tokens) != NC_NOERR;
  nc_type type;
  MPI_Offset n = 0;
  if (ncmpi_inq_att(nc, NC_GLOBAL, "comm_levels", &type, &n) == NC_NOERR) { /* adaptive levels, when saved */
    bad |= type != NC_FLOAT || n < 2 || n > 128;
    if (!bad) bad |= ncmpi_get_att_float(nc, NC_GLOBAL, "comm_levels", r->comm_levels) != NC_NOERR;
    r->comm_nlevels = bad ? 0 : (int)n;
  }
  if (ncmpi_inq_att(nc, NC_GLOBAL, "data_seq_len", &type, &n) == NC_NOERR) { /* older files say it only in their deck */
    bad |= type != NC_INT64 || n != 1;
    if (!bad) bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "data_seq_len", &r->seq_len) != NC_NOERR || r->seq_len < 1;
  }
  if (ncmpi_inq_att(nc, NC_GLOBAL, "data_blend_windows", &type, &n) == NC_NOERR) { /* a blend's cursors */
    bad |= type != NC_INT64 || n < 2 || n > CFG_LIST_MAX;
    if (!bad) bad |= ncmpi_get_att_longlong(nc, NC_GLOBAL, "data_blend_windows", r->blend) != NC_NOERR;
    r->nblend = bad ? 0 : (int)n;
  }
  return bad ? -1 : 0;
}

/* ---- the error-feedback residual (&comm error_feedback) -----------------------------------------
 * comm_residual (comm_residual_values = D x N): replica r's residual over the whole model at
 * [r N, (r + 1) N), tensor after tensor in the order of the whole model's tensor list (N its
 * parameter count), with the writer's D as the attribute `replicas`. Every rank writes its stage's
 * tensors into its replica's row (the last stage leaves the tied embedding to the first: the same
 * residual) and reads them back when the job has as many replicas; otherwise the residual starts
 * from zero. */

/* Where each whole-model tensor starts in a replica's row; *N the row's length. */
static size_t *row_starts(const gpt_tensor *all, int nall, size_t *N) {
  size_t *at = util_malloc(((size_t)nall + 1) * sizeof *at, "residual rows");
  *N = 0;
  for (int i = 0; i < nall; i++) at[i] = *N, *N += all[i].numel;
  return at;
}

/* A replica's row's length: the whole model's parameter count. */
static size_t row_length(const gpt_tensor *all, int nall) {
  size_t N = 0;
  for (int i = 0; i < nall; i++) N += all[i].numel;
  return N;
}

static int define_residual(int nc, const ckpt_state *s, const gpt_tensor *all, int nall, int *var) {
  size_t N = row_length(all, nall);
  long long D = s->lay->D;
  unsigned long long zero = 0;
  int dim, rc = ncmpi_def_dim(nc, "comm_residual_values", (MPI_Offset)(D * (long long)N), &dim);
  if (rc == NC_NOERR) rc = ncmpi_def_var(nc, "comm_residual", NC_FLOAT, 1, &dim, var);
  if (rc == NC_NOERR) rc = ncmpi_put_att_longlong(nc, *var, "replicas", NC_INT64, 1, &D);
  if (rc == NC_NOERR) rc = put_text(nc, *var, "holders", s->comm_residual_holders ? s->comm_residual_holders : "");
  if (rc == NC_NOERR) rc = ncmpi_put_att_ulonglong(nc, *var, "checksum", NC_UINT64, 1, &zero);
  return rc;
}

/* This rank's residual to or from its replica's row of var (host memory from here on), counted in
 * checksum `sum` (the last stage's copy of the tied embedding is read, not written, and not
 * counted); with expect, the reads are only announced (io_expect, before io_start). */
static void residual_ranges(io_stream *io, const ckpt_state *s, int var, const gpt_tensor *all, int nall, int sum,
                            int expect) {
  size_t N, *at = row_starts(all, nall, &N), row = (size_t)s->lay->replica * N;
  ckpt_piece *p;
  int n = pieces_of(s->model, s->lay, 0, s->model->nparams, &p);
  io->host = 1;
  for (int i = 0; i < n; i++) {
    size_t a = row + at[p[i].t] + p[i].a, b = a + (p[i].b - p[i].a);
    if (io->write && !p[i].counted) continue;
    if (expect) io_expect(io, var, a, b);
    else io_range(io, var, 1, a, b, s->comm_residual + p[i].off, p[i].counted ? sum : -1);
  }
  free(p), free(at);
}

/* ---- PowerSGD's warm start (&comm method = 'powersgd') ------------------------------------------
 * comm_powersgd_q (comm_powersgd_q_values = psgd_q_floats of the whole model): each factored
 * tensor's Q (cols x r) in the order of the whole model's tensor list, with the rank r as the
 * attribute `rank` and a checksum (the sum of the tensors' hashes). Replica 0 of each stage writes
 * its tensors' Q (in two levels, each tensor's leader on the first node; the last stage leaves the
 * tied embedding to the first: the same Q), independently: the values are small. Every rank reads its own when the file has them at its rank; otherwise Q
 * starts from the seed. */

typedef struct {
  size_t whole, local, n; /* where a tensor's Q sits in the variable and in the stage's Q; its floats */
  int counted;            /* written (and checksummed) by replica 0 */
} q_span;

/* This rank's factored tensors' spans into sp (nall at most); their number. *total: the variable's length. */
static int q_spans(const ckpt_state *s, const gpt_tensor *all, int nall, q_span *sp, size_t *total) {
  const long r = s->comm_lowrank_rank;
  size_t *at = util_malloc(((size_t)nall + 1) * sizeof *at, "Q spans");
  *total = 0;
  for (int i = 0; i < nall; i++) at[i] = *total, *total += psgd_q_floats(&all[i], 1, r);
  int n = 0;
  size_t local = 0;
  for (int i = s->comm_lowrank_t0; i < s->comm_lowrank_t1; i++) {
    const gpt_tensor *t = &s->model->tensors[i];
    const size_t len = psgd_q_floats(t, 1, r);
    if (!len) continue;
    const int last_copy = t->tied && s->lay->P > 1 && s->lay->stage == s->lay->P - 1;
    sp[n++] = (q_span){at[t->index], local, len, s->comm_lowrank_writes && !last_copy};
    local += len;
  }
  free(at);
  return n;
}

/* The sum over the job of the counted spans' hashes (each keyed by its place). */
static unsigned long long q_checksum(const ckpt_state *s, const q_span *sp, int n) {
  unsigned long long h = 0, total = 0;
  for (int i = 0; i < n; i++)
    if (sp[i].counted) h += util_hash64(s->comm_lowrank_q + sp[i].local, sp[i].n * sizeof(float), sp[i].whole);
  MPI_Allreduce(&h, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, s->lay->comm);
  return total;
}

/* In define mode: the variable, its rank and checksum (collective). */
static int define_lowrank(int nc, const ckpt_state *s, const gpt_tensor *all, int nall, int *var) {
  q_span *sp = util_malloc((size_t)nall * sizeof *sp, "Q spans");
  size_t total;
  int n = q_spans(s, all, nall, sp, &total), dim;
  unsigned long long sum = q_checksum(s, sp, n);
  long long r = s->comm_lowrank_rank;
  int rc = ncmpi_def_dim(nc, "comm_powersgd_q_values", (MPI_Offset)(total ? total : 1), &dim);
  if (rc == NC_NOERR) rc = ncmpi_def_var(nc, "comm_powersgd_q", NC_FLOAT, 1, &dim, var);
  if (rc == NC_NOERR) rc = ncmpi_put_att_longlong(nc, *var, "rank", NC_INT64, 1, &r);
  if (rc == NC_NOERR) rc = ncmpi_put_att_ulonglong(nc, *var, "checksum", NC_UINT64, 1, &sum);
  free(sp);
  return rc;
}

/* In data mode: this rank's spans written (the counted ones) or read. NC_NOERR or the first error. */
static int lowrank_io(int nc, const ckpt_state *s, int var, const gpt_tensor *all, int nall, int write) {
  q_span *sp = util_malloc((size_t)nall * sizeof *sp, "Q spans");
  size_t total;
  int n = q_spans(s, all, nall, sp, &total), rc = ncmpi_begin_indep_data(nc);
  for (int i = 0; i < n && rc == NC_NOERR; i++) {
    MPI_Offset start = (MPI_Offset)sp[i].whole, count = (MPI_Offset)sp[i].n;
    if (write && sp[i].counted) rc = ncmpi_put_vara_float(nc, var, &start, &count, s->comm_lowrank_q + sp[i].local);
    else if (!write) rc = ncmpi_get_vara_float(nc, var, &start, &count, s->comm_lowrank_q + sp[i].local);
  }
  int erc = ncmpi_end_indep_data(nc);
  free(sp);
  return rc != NC_NOERR ? rc : erc;
}

static int define(int nc, const ckpt_state *s, const gpt_tensor *all, int nall, const uint64_t *sums, int *vars) {
  const cfg_config *cfg = s->cfg;
  int rc = s->comm_residual ? define_residual(nc, s, all, nall, &vars[3 * nall]) : NC_NOERR;
  /* one dimension per distinct length */
  enum { MAXD = 64 };
  long long dlen[MAXD];
  int did[MAXD], nd = 0;
  for (int i = 0; i < nall && rc == NC_NOERR; i++) {
    long long lens[2] = {all[i].rows, all[i].cols};
    int dims[2];
    int ndim = all[i].cols > 1 ? 2 : 1;
    for (int d = 0; d < ndim; d++) {
      int k = 0;
      while (k < nd && dlen[k] != lens[d]) k++;
      if (k == nd) {
        char name[32];
        snprintf(name, sizeof name, "n%lld", lens[d]);
        UTIL_CHECK(nd < MAXD, NULL, "internal: too many dimension lengths");
        rc = ncmpi_def_dim(nc, name, (MPI_Offset)lens[d], &did[nd]);
        dlen[nd++] = lens[d];
      }
      dims[d] = did[k];
    }
    for (int k = 0; k < 3 && rc == NC_NOERR; k++) {
      char name[160];
      snprintf(name, sizeof name, "%s%s", KIND_PREFIX[k], all[i].name);
      rc = ncmpi_def_var(nc, name, NC_FLOAT, ndim, dims, &vars[3 * i + k]);
      if (rc == NC_NOERR)
        rc = ncmpi_put_att_ulonglong(nc, vars[3 * i + k], "checksum", NC_UINT64, 1, (const unsigned long long *)&sums[3 * i + k]);
    }
  }
  if (rc != NC_NOERR) return rc;
  char created[64], pattern[2048];
  time_t now = time(NULL);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  attention_pattern(&cfg->model, pattern, sizeof pattern);
  char *deck = NULL;
  size_t dlen2 = 0;
  FILE *fp = open_memstream(&deck, &dlen2);
  cfg_write_deck(cfg, fp, NULL);
  fclose(fp);
  shape_attr sa[16];
  int ns = shape_attrs(cfg, sa);
  rc |= put_text(nc, NC_GLOBAL, "title", "greenlm checkpoint: parameters in their global shapes (Hugging Face names), "
                                         "AdamW moments adam_m.* and adam_v.*, and the run state");
  rc |= put_text(nc, NC_GLOBAL, "format", CKPT_FORMAT);
  rc |= put_i64(nc, "format_version", CKPT_VERSION);
  rc |= put_text(nc, NC_GLOBAL, "greenlm_version", PACKAGE_VERSION);
  rc |= put_text(nc, NC_GLOBAL, "created", created);
  rc |= put_text(nc, NC_GLOBAL, "arch", cfg->model.arch);
  for (int i = 0; i < ns; i++) rc |= put_i64(nc, sa[i].name, sa[i].value);
  rc |= put_text(nc, NC_GLOBAL, "attention_types", pattern);
  rc |= put_f64(nc, "layer_norm_epsilon", cfg->model.layer_norm_epsilon);
  run_state rs;
  state_of(s, &rs);
  rc |= put_state(nc, &rs);
  rc |= put_text(nc, NC_GLOBAL, "rng", "counter-based: initialisation, data order and sampling draw from streams "
                                       "(seed, purpose, index); the data order is (seed, epoch) and the cursor "
                                       "(data_epoch, data_position)");
  rc |= put_i64(nc, "writer_ranks", s->lay->size);
  rc |= put_i64(nc, "writer_pipeline_stages", s->lay->P);
  rc |= put_i64(nc, "writer_tensor_parallel", s->lay->tp);
  rc |= put_i64(nc, "writer_data_parallel", s->lay->D);
  rc |= put_i64(nc, "writer_zero_stage", s->lay->zero);
  rc |= put_text(nc, NC_GLOBAL, "deck", deck);
  free(deck);
  return rc;
}

/* ---- writing ---------------------------------------------------------------------------------- */

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

/* The step of a file name that is exactly a checkpoint's, "ckpt-SSSSSSSS.nc" + tail (the step
 * zero-padded to 8 digits or more, as ckpt_write names them), or -1: other names in the directory
 * ("ckpt-12.nc", "ckpt-00000012.nc.bak", a directory's name) are never taken for checkpoints. */
static long step_of(const char *name, const char *tail) {
  if (strncmp(name, "ckpt-", 5) != 0) return -1;
  const char *p = name + 5, *q = p;
  while (*q >= '0' && *q <= '9') q++;
  if (q - p < 8 || q - p > 18 || strncmp(q, ".nc", 3) != 0 || strcmp(q + 3, tail) != 0) return -1;
  long step = strtol(p, NULL, 10);
  char canon[32];
  util_snprintf(canon, sizeof canon, "%08ld", step);
  return (size_t)(q - p) == strlen(canon) && strncmp(canon, p, (size_t)(q - p)) == 0 ? step : -1;
}

/* Steps of the files ckpt-STEP.nc<tail> in dir, ascending: tail "" lists the complete checkpoints,
 * ".tmp" the unfinished ones. Returns the count (*steps to free()). */
static int list_checkpoints(const char *dir, const char *tail_want, long **steps) {
  int n = 0, cap = 16;
  *steps = util_malloc((size_t)cap * sizeof(long), "checkpoints");
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    long step = step_of(de->d_name, tail_want);
    if (step < 0) continue;
    char path[CKPT_PATH_MAX + 300];
    struct stat sb;
    util_snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* a directory by a checkpoint's name is none */
    if (n == cap) *steps = util_realloc(*steps, (size_t)(cap *= 2) * sizeof(long), "checkpoints");
    (*steps)[n++] = step;
  }
  closedir(d);
  qsort(*steps, (size_t)n, sizeof(long), cmp_long);
  return n;
}

/* After a checkpoint is complete: the oldest beyond `keep` go, and so do unfinished ones left by
 * jobs killed while writing (never read, but they take space). */
static void prune(const char *dir, long keep) {
  long *steps;
  char path[CKPT_PATH_MAX + 32];
  int n = list_checkpoints(dir, "", &steps);
  for (int i = 0; i < n - keep; i++) {
    util_snprintf(path, sizeof path, "%s/ckpt-%08ld.nc", dir, steps[i]);
    remove(path);
  }
  free(steps);
  n = list_checkpoints(dir, ".tmp", &steps);
  for (int i = 0; i < n; i++) {
    util_snprintf(path, sizeof path, "%s/ckpt-%08ld.nc.tmp", dir, steps[i]);
    remove(path);
  }
  free(steps);
}

int ckpt_write(const ckpt_state *s, ckpt_stats *st, err_list *errs) {
  const par_layout *lay = s->lay;
  MPI_Comm comm = lay->comm;
  double t0 = util_now();
  char dir[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX + 16];
  ckpt_dir(s->cfg, dir, sizeof dir);
  util_snprintf(st->path, sizeof st->path, "%s/ckpt-%08ld.nc", dir, s->step);
  util_snprintf(tmp, sizeof tmp, "%s.tmp", st->path);
  int rc = 0;
  if (lay->rank == 0 && util_mkdir_p(dir) != 0) {
    err_add(errs, dir, 0, 0, CKPT_WRITE_HINT, "cannot create the checkpoint directory: %s", strerror(errno));
    rc = -1;
  } else if (lay->rank == 0) {
    remove(tmp); /* left by a job that died while writing this step */
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  if (rc) return -1;
  gpt_shape shape;
  gpt_shape_from_cfg(&shape, &s->cfg->model);
  int nall;
  gpt_tensor *all = gpt_list_tensors(&shape, gpt_whole(&shape), &nall);
  const int nsums = 3 * nall + (s->comm_residual != NULL); /* the residual last, when there is one */
  uint64_t *sums = util_malloc((size_t)nsums * sizeof *sums, "checksums"), *total = util_malloc((size_t)nsums * sizeof *total, "checksums");
  int *vars = util_malloc((size_t)nsums * sizeof *vars, "variables");
  MPI_Info info = io_hints();
  int nc, nrc = ncmpi_create(comm, tmp, NC_CLOBBER | NC_64BIT_DATA, info, &nc);
  MPI_Info_free(&info);
  int wrc = nrc; /* this rank's first error */
  MPI_Offset extent = 0;
  if (nrc == NC_NOERR) {
    io_stream io;
    io_open(&io, nc, 1, s, sums, nsums, tmp, comm);
    nrc = define(nc, s, all, nall, sums, vars); /* checksums 0 until the data has passed */
    int qvar = -1;
    if (s->comm_lowrank_q) { /* collective whatever nrc says */
      int qrc = define_lowrank(nc, s, all, nall, &qvar);
      if (nrc == NC_NOERR) nrc = qrc;
    }
    if (nrc == NC_NOERR) nrc = ncmpi_enddef(nc);
    io.rc = nrc;
    if (nrc == NC_NOERR) extent = ncfile_extent(nc);
    if (nrc == NC_NOERR) reserve(tmp, extent, comm);
    rehearse_pause();
    size_t lo, hi;
    own_piece(s->model, lay, &lo, &hi);
    ckpt_piece *p;
    int n = nrc == NC_NOERR ? pieces_of(s->model, lay, lo, hi, &p) : 0;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < 3 && p[i].counted; k++) io_range(&io, vars[3 * p[i].t + k], all[p[i].t].cols, p[i].a, p[i].b, addr(s, k, p[i].off), 3 * p[i].t + k);
    if (n) free(p);
    if (nrc == NC_NOERR && s->comm_residual) residual_ranges(&io, s, vars[3 * nall], all, nall, 3 * nall, 0);
    io_close(&io);
    if (nrc == NC_NOERR && s->comm_lowrank_q) {
      int qrc = lowrank_io(nc, s, qvar, all, nall, 1);
      if (io.rc == NC_NOERR) io.rc = qrc;
    }
    /* the checksums: every rank's share summed, into the attributes defined above (same size) */
    MPI_Allreduce(sums, total, nsums, MPI_UINT64_T, MPI_SUM, comm);
    if (nrc == NC_NOERR) {
      int crc = ncmpi_redef(nc);
      for (int i = 0; i < nsums && crc == NC_NOERR; i++)
        crc = ncmpi_put_att_ulonglong(nc, vars[i], "checksum", NC_UINT64, 1, (const unsigned long long *)&total[i]);
      if (crc == NC_NOERR) crc = ncmpi_enddef(nc);
      if (io.rc == NC_NOERR) io.rc = crc;
    }
    /* durable on every rank's node (each flushes what it wrote), then out of the page cache */
    int crc = ncmpi_sync(nc);
    if (io.rc == NC_NOERR) io.rc = crc;
    io_release(&io);
    crc = ncmpi_close(nc);
    wrc = io.rc == NC_NOERR ? crc : io.rc;
  }
  /* all ranks agree; rank 0 gives the file its name (durably), and drops the oldest */
  int lost = wrc == NC_NOERR && short_file(tmp, extent, comm, errs);
  int any = ncfile_commit(comm, wrc != NC_NOERR || lost, tmp, st->path, "checkpoint", CKPT_WRITE_HINT, errs);
  st->seconds = util_now() - t0; /* the write, made durable and named; the pruning is housekeeping */
  if (lay->rank == 0 && !any) prune(dir, s->cfg->checkpoint.keep);
  char room[512];
  if (wrc != NC_NOERR)
    err_add(errs, tmp, 0, 0, CKPT_WRITE_HINT, "writing the checkpoint failed: %s%s", ncmpi_strerror(wrc),
            extent > 0 ? room_note(tmp, extent, room, sizeof room) : "");
  if (any) rc = -1;
  st->bytes = 3.0 * sizeof(float) * (double)gpt_count_params(&shape); /* parameters and two moments */
  free(all), free(sums), free(total), free(vars);
  gpt_shape_free(&shape);
  return rc;
}

/* ---- finding and reading ------------------------------------------------------------------------ */

int ckpt_candidates(const cfg_config *cfg, char (**paths)[CKPT_PATH_MAX]) {
  const char *r = cfg->checkpoint.restart;
  if (!cfg_restart_latest(&cfg->checkpoint)) {
    *paths = util_malloc(sizeof **paths, "checkpoint paths");
    util_snprintf((*paths)[0], CKPT_PATH_MAX, "%s", r);
    return 1;
  }
  char dir[CKPT_PATH_MAX];
  ckpt_dir(cfg, dir, sizeof dir);
  long *steps;
  int n = list_checkpoints(dir, "", &steps);
  *paths = util_malloc((size_t)(n ? n : 1) * sizeof **paths, "checkpoint paths");
  for (int i = 0; i < n; i++) util_snprintf((*paths)[i], CKPT_PATH_MAX, "%s/ckpt-%08ld.nc", dir, steps[n - 1 - i]);
  free(steps);
  return n;
}

int ckpt_count(const char *dir) {
  long *steps;
  int n = list_checkpoints(dir, "", &steps);
  free(steps);
  return n;
}

int ckpt_check_dir(const cfg_config *cfg, err_list *errs) {
  char dir[CKPT_PATH_MAX], probe[CKPT_PATH_MAX + 32];
  ckpt_dir(cfg, dir, sizeof dir);
  const char *key = cfg->checkpoint.dir[0] ? "dir" : NULL;
  const char *hint = "give &checkpoint dir a directory greenlm can create and write, on a disk with room";
  if (util_mkdir_p(dir) != 0) {
    if (key) cfg_error_at(cfg, errs, "checkpoint", "dir", hint, "cannot create the checkpoint directory '%s': %s", dir, strerror(errno));
    else err_add(errs, dir, 0, 0, hint, "cannot create the checkpoint directory: %s", strerror(errno));
    return -1;
  }
  util_snprintf(probe, sizeof probe, "%s/.greenlm-probe-%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || write(fd, "x", 1) != 1) {
    int e = errno;
    if (fd >= 0) close(fd), unlink(probe);
    if (key) cfg_error_at(cfg, errs, "checkpoint", "dir", hint, "cannot write in the checkpoint directory '%s': %s", dir, strerror(e));
    else err_add(errs, dir, 0, 0, hint, "cannot write in the checkpoint directory: %s", strerror(e));
    return -1;
  }
  close(fd);
  unlink(probe);
  return 0;
}

int ckpt_set_aside_dir(const cfg_config *cfg, char *moved, size_t len, err_list *errs) {
  char dir[CKPT_PATH_MAX];
  ckpt_dir(cfg, dir, sizeof dir);
  char stamp[32];
  time_t now = time(NULL);
  strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", gmtime(&now));
  util_snprintf(moved, len, "%s.replaced-%s", dir, stamp);
  for (int k = 2; access(moved, F_OK) == 0 && k < 100; k++) util_snprintf(moved, len, "%s.replaced-%s-%d", dir, stamp, k);
  if (rename(dir, moved) != 0) {
    err_add(errs, dir, 0, 0, "move the earlier run's checkpoints away yourself, or choose another run_dir",
            "cannot move the earlier run's checkpoints aside to '%s': %s", moved, strerror(errno));
    return -1;
  }
  return 0;
}

int ckpt_set_aside_file(const char *path, char *moved, size_t len) {
  util_snprintf(moved, len, "%s.damaged", path);
  return rename(path, moved);
}

/* Compare the file's model with the deck's: every mismatch is an error. */
static void check_shape(int nc, const ckpt_state *s, const char *path, const gpt_tensor *all, int nall, int *vars,
                        err_list *errs) {
  const cfg_config *cfg = s->cfg;
  shape_attr sa[16];
  int ns = shape_attrs(cfg, sa);
  char where[CFG_STR_LEN + 80];
  util_snprintf(where, sizeof where, "%s", path);
  const char *hint = "restart with the deck that made the checkpoint, or start a new run without &checkpoint restart";
  for (int i = 0; i < ns; i++) {
    long long v = -1;
    ncmpi_get_att_longlong(nc, NC_GLOBAL, sa[i].name, &v);
    if (v != sa[i].value)
      err_add(errs, where, 0, 0, hint, "the checkpoint's %s is %lld, the deck's %lld", sa[i].name, v, sa[i].value);
  }
  char text[2048] = "", pattern[2048];
  MPI_Offset tl = 0;
  if (ncmpi_inq_attlen(nc, NC_GLOBAL, "arch", &tl) == NC_NOERR && tl < (MPI_Offset)sizeof text) {
    ncmpi_get_att_text(nc, NC_GLOBAL, "arch", text);
    text[tl] = '\0';
  }
  if (strcmp(text, cfg->model.arch) != 0)
    err_add(errs, where, 0, 0, hint, "the checkpoint's arch is '%s', the deck's '%s'", text, cfg->model.arch);
  attention_pattern(&cfg->model, pattern, sizeof pattern);
  text[0] = '\0';
  if (ncmpi_inq_attlen(nc, NC_GLOBAL, "attention_types", &tl) == NC_NOERR && tl < (MPI_Offset)sizeof text) {
    ncmpi_get_att_text(nc, NC_GLOBAL, "attention_types", text);
    text[tl] = '\0';
  }
  if (strcmp(text, pattern) != 0)
    err_add(errs, where, 0, 0, hint, "the checkpoint's attention_types are '%s', the deck's '%s'", text, pattern);
  int shown = 0;
  for (int i = 0; i < nall; i++)
    for (int k = 0; k < kinds(s); k++) {
      char name[160];
      snprintf(name, sizeof name, "%s%s", KIND_PREFIX[k], all[i].name);
      int ndim = 0, dims[8];
      MPI_Offset len[2] = {0, 1};
      if (ncmpi_inq_varid(nc, name, &vars[3 * i + k]) != NC_NOERR) {
        if (shown++ < 10) err_add(errs, where, 0, 0, hint, "variable %s is missing", name);
        continue;
      }
      ncmpi_inq_varndims(nc, vars[3 * i + k], &ndim);
      if (ndim < 1 || ndim > 2) ndim = 0;
      if (ndim) ncmpi_inq_vardimid(nc, vars[3 * i + k], dims);
      for (int d = 0; d < ndim; d++) ncmpi_inq_dimlen(nc, dims[d], &len[d]);
      if (ndim != (all[i].cols > 1 ? 2 : 1) || len[0] != all[i].rows || (ndim == 2 && len[1] != all[i].cols))
        if (shown++ < 10)
          err_add(errs, where, 0, 0, hint, "variable %s has shape (%lld, %lld) in the checkpoint, (%d, %d) in the deck",
                        name, (long long)len[0], (long long)len[1], all[i].rows, all[i].cols);
    }
  if (shown > 10) err_add(errs, where, 0, 0, NULL, "... and %d more mismatched variables", shown - 10);
}

static const char DAMAGED_HINT[] = "the file is damaged; restart from an older checkpoint (&checkpoint restart = "
                                   "'latest' with fallback = .true. does so by itself)";
static const char MISMATCH_HINT[] = "restart with the deck, tokenizer and datasets that made the checkpoint, or start a "
                                    "new run without &checkpoint restart";

/* A blend's cursors that cannot be: negative, or not summing to the position. */
static int blend_damaged(const run_state *r) {
  long long sum = 0;
  for (int k = 0; k < r->nblend; k++) {
    if (r->blend[k] < 0) return 1;
    sum += r->blend[k];
  }
  return r->nblend > 0 && (sum != r->position || r->epoch != 0);
}

/* The loader moved to the state's cursor: the dataset's, or each of a blend's. */
static void seek_state(data_loader *d, const run_state *r) {
  if (r->nblend == 0) {
    data_seek(d, 0, (long)r->epoch, (uint64_t)r->position);
    return;
  }
  for (int k = 0; k < d->nsets; k++)
    data_seek(d, k, (long)((uint64_t)r->blend[k] / d->set[k].nwin), (uint64_t)r->blend[k] % d->set[k].nwin);
}

/* The integer group.key of a parsed deck, or 0. */
static long doc_int(const nml_doc *doc, const char *group, const char *key) {
  for (int g = 0; g < doc->n; g++)
    for (int k = 0; k < doc->groups[g].n && !strcmp(doc->groups[g].name, group); k++) {
      const nml_entry *en = &doc->groups[g].entries[k];
      if (!strcmp(en->key, key) && en->nvals == 1 && en->vals[0].kind == NML_INT) return (long)en->vals[0].i;
    }
  return 0;
}

/* The &training seq_len of the deck the checkpoint holds (its "deck" attribute), or 0 when it
 * holds none that says: how a file written before data_seq_len was kept tells it. */
static long deck_seq_len(int nc) {
  MPI_Offset len = 0;
  if (ncmpi_inq_attlen(nc, NC_GLOBAL, "deck", &len) != NC_NOERR || len <= 0 || len > NML_MAX_BYTES) return 0;
  char *text = util_malloc((size_t)len + 1, "the checkpoint's deck");
  long T = 0;
  if (ncmpi_get_att_text(nc, NC_GLOBAL, "deck", text) == NC_NOERR) {
    text[len] = '\0';
    nml_doc doc = {0};
    err_list e = {0};
    if (nml_parse(text, (size_t)len, "checkpoint deck", &doc, &e) == 0) T = doc_int(&doc, "training", "seq_len");
    nml_doc_free(&doc);
    err_free(&e);
  }
  free(text);
  return T;
}

/* A training restart continues the loader's cursor, which counts windows of the checkpoint's
 * seq_len: another seq_len would draw other windows than the ones the run promised (and the
 * cursor's bounds would not hold), so it is refused at the deck's key. 0, or -1 after the error. */
static int check_seq_len(const ckpt_state *s, const run_state *r, int nc, const char *path, err_list *errs) {
  const long T = r->seq_len > 0 ? (long)r->seq_len : deck_seq_len(nc), mine = s->cfg->training.seq_len;
  if (!s->data || T <= 0 || T == mine) return 0;
  char hint[384];
  util_snprintf(hint, sizeof hint, "set &training seq_len = %ld to continue the run; to train on with windows of %ld, "
                "export the model (task 'export') and start a new run from it (&model init_from)", T, mine);
  cfg_error_at(s->cfg, errs, "training", "seq_len", hint, "%ld, but the checkpoint %s was trained on windows of seq_len = "
               "%ld: its data loader's cursor counts those windows and does not continue in windows of %ld", mine, path,
               T, mine);
  return -1;
}

/* The run state against its checksum, its bounds and this run's deck, tokenizer and data. Every
 * problem is an error at the file (seq_len at its deck key); *damaged says whether the file itself
 * is at fault. */
static void check_state(ckpt_state *s, int nc, const char *path, int *damaged, err_list *errs) {
  run_state r;
  char sum[32] = "", want[32];
  if (get_state(nc, &r, sum, sizeof sum) != 0) {
    err_add(errs, path, 0, 0, DAMAGED_HINT, "the run state (step, tokens, loader cursor, seed) is missing or damaged");
    *damaged = 1;
    return;
  }
  util_snprintf(want, sizeof want, "%016llx", (unsigned long long)state_checksum(&r));
  uint64_t nwin = s->data ? s->data->set[0].nwin : 0;
  int single = s->data && s->data->nsets == 1 && r.nblend == 0;
  if (sum[0] && strcmp(sum, want) != 0) {
    err_add(errs, path, 0, 0, DAMAGED_HINT, "the run state does not match its checksum (%s, computed %s)", sum, want);
    *damaged = 1;
  } else if (check_seq_len(s, &r, nc, path, errs) != 0) {
    return; /* the cursor's bounds are another seq_len's */
  } else if (r.step < 0 || r.step > (1LL << 53) || !(r.tokens >= 0 && r.tokens < 1e300) || r.epoch < 0 ||
             r.position < 0 || (single && (uint64_t)r.position > nwin) || blend_damaged(&r) || !(r.loss_scale > 0 && r.loss_scale <= 1e300)) {
    err_add(errs, path, 0, 0, MISMATCH_HINT, "the run state is out of bounds: step %lld, tokens %g, loader at window %lld "
            "of epoch %lld (the dataset has %llu windows), loss scale %g", r.step, r.tokens, r.position, r.epoch,
            (unsigned long long)nwin, r.loss_scale);
    *damaged = !s->data || r.dataset_tokens == data_train_tokens(s->data); /* same data: the numbers are damaged */
  }
  if (*damaged) return;
  run_state now;
  state_of(s, &now);
  if (strcmp(r.tokenizer_hash, now.tokenizer_hash) != 0)
    err_add(errs, path, 0, 0, MISMATCH_HINT, "the checkpoint was trained with another tokenizer (hash %s; this run's "
            "has hash %s)", r.tokenizer_hash, now.tokenizer_hash);
  if (s->opt && r.seed != now.seed) /* a model read without its optimizer does not continue the data order */
    err_add(errs, path, 0, 0, MISMATCH_HINT, "the checkpoint's &job seed is %lld, the deck's %lld (the data order "
            "follows it)", r.seed, now.seed);
  if (r.dataset[0] && s->data && (r.dataset_tokens != now.dataset_tokens || strcmp(r.dataset, now.dataset) != 0))
    err_add(errs, path, 0, 0, MISMATCH_HINT, "the checkpoint was trained on another dataset (%lld tokens, identity %s); "
            "&data train '%s'%s has %lld tokens, identity %s", r.dataset_tokens, r.dataset, s->cfg->data.train.v[0],
            s->cfg->data.train.n > 1 ? " and the rest of its blend" : "", now.dataset_tokens, now.dataset);
  if (s->data && r.nblend != now.nblend)
    err_add(errs, path, 0, 0, MISMATCH_HINT, "the checkpoint was trained on %d dataset%s; &data train lists %d",
            r.nblend ? r.nblend : 1, r.nblend ? "s" : "", s->data->nsets);
  s->step = (long)r.step;
  s->tokens = r.tokens;
  s->loss_scale = r.loss_scale;
  s->comm_nlevels = r.comm_nlevels;
  memcpy(s->comm_levels, r.comm_levels, sizeof s->comm_levels);
  if (s->data && r.nblend == now.nblend) seek_state(s->data, &r);
}

/* Open the file and check that it is a greenlm checkpoint of a format this greenlm reads. */
static int open_checkpoint(const ckpt_state *s, const char *path, int *nc, int *damaged, err_list *errs) {
  MPI_Info info = io_hints();
  int rc = ncfile_open(s->lay->comm, path, info, "checkpoint", "give the path of a checkpoint, or 'latest'", nc, errs);
  MPI_Info_free(&info);
  if (rc != 0) {
    *damaged = 1;
    return -1;
  }
  char format[64];
  long long version = 0;
  ncfile_get_text(*nc, -1, "format", format, sizeof format);
  ncmpi_get_att_longlong(*nc, NC_GLOBAL, "format_version", &version);
  if (strcmp(format, CKPT_FORMAT) != 0 || version < 1 || version > CKPT_VERSION) {
    if (strcmp(format, CKPT_FORMAT) != 0)
      err_add(errs, path, 0, 0, "give the path of a checkpoint written by greenlm", "not a greenlm checkpoint (its "
              "format attribute is '%s')", format);
    else
      err_add(errs, path, 0, 0, "restart with the greenlm that wrote it", "checkpoint format version %lld; this "
              "greenlm reads versions 1 to %d", version, CKPT_VERSION);
    *damaged = strcmp(format, CKPT_FORMAT) != 0;
    ncmpi_close(*nc);
    return -1;
  }
  return 0;
}

/* The error of a NaN or infinity at file offset `at` (io_stream.nonfinite): its variable and element.
 * A run that meets one stops before any checkpoint, so the file is damaged (its checksums agree
 * only when it was written so). */
static void nonfinite_error(int nc, const char *path, const gpt_tensor *all, int nall, const int *vars, int nkinds,
                            MPI_Offset at, err_list *errs) {
  for (int i = 0; i < nall; i++)
    for (int k = 0; k < nkinds; k++) {
      MPI_Offset off;
      const size_t n = (size_t)all[i].rows * (size_t)all[i].cols;
      if (ncmpi_inq_varoffset(nc, vars[3 * i + k], &off) != NC_NOERR || at < off ||
          at >= off + (MPI_Offset)(n * sizeof(float)))
        continue;
      const long long e = (long long)((at - off) / (MPI_Offset)sizeof(float));
      err_add(errs, path, 0, 0, DAMAGED_HINT, "variable %s%s: element %lld (row %lld, column %lld) is a NaN or an infinity",
              KIND_PREFIX[k], all[i].name, e, e / all[i].cols, e % all[i].cols);
      return;
    }
}

/* This replica's piece of every variable, read, verified against the checksums and shared with
 * the other replicas. Adds an error per damaged variable (a checksum that disagrees; then a NaN or
 * an infinity, on the ranks that read one); returns the count. */
static int read_tensors(ckpt_state *s, int nc, const char *path, const gpt_tensor *all, int nall, const int *vars,
                        ckpt_stats *st, err_list *errs) {
  const par_layout *lay = s->lay;
  MPI_Comm comm = lay->comm;
  io_stream io = {.fd = -1};
  uint64_t *sums = util_malloc((size_t)nall * 3 * sizeof *sums, "checksums"), *total = util_malloc((size_t)nall * 3 * sizeof *total, "checksums");
  io_open(&io, nc, 0, s, sums, 3 * nall, path, comm);
  size_t lo, hi;
  own_piece(s->model, lay, &lo, &hi);
  ckpt_piece *p;
  int n = pieces_of(s->model, lay, lo, hi, &p), shown = 0;
  sharer sh;
  int overlap = lay->D > 1 && s->model->be->caps.host_memory; /* device memory: shared after, through a host buffer */
  if (overlap) share_open(&sh, s), io.poll = share_poll, io.poll_arg = &sh;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < kinds(s); k++) io_expect(&io, vars[3 * p[i].t + k], p[i].a, p[i].b);
  io_start(&io, path, &s->cfg->checkpoint);
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < kinds(s); k++)
      io_range(&io, vars[3 * p[i].t + k], all[p[i].t].cols, p[i].a, p[i].b, addr(s, k, p[i].off), p[i].counted ? 3 * p[i].t + k : -1);
    if (overlap) io_flush(&io, 0), share_post(&sh, p[i].off + (p[i].b - p[i].a)); /* piece i is in place */
  }
  free(p);
  io_close(&io);
  st->direct = io.direct;
  if (overlap) {
    double t1 = util_now();
    share_close(&sh);
    st->share_seconds = util_now() - t1;
  }
  int bad = io.rc != NC_NOERR, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (bad) err_add(errs, path, 0, 0, DAMAGED_HINT, "reading the tensors failed: %s", ncmpi_strerror(io.rc));
  if (!any) { /* every rank's share of each variable, summed, against the writer's checksum */
    MPI_Allreduce(sums, total, nall * 3, MPI_UINT64_T, MPI_SUM, comm);
    for (int i = 0; i < nall; i++)
      for (int k = 0; k < kinds(s); k++) {
        unsigned long long want = 0;
        ncmpi_get_att_ulonglong(nc, vars[3 * i + k], "checksum", &want);
        if (want != total[3 * i + k] && shown++ < 10)
          err_add(errs, path, 0, 0, DAMAGED_HINT, "checksum mismatch in variable %s%s", KIND_PREFIX[k], all[i].name);
      }
    if (shown > 10) err_add(errs, path, 0, 0, NULL, "... and %d more variables with wrong checksums", shown - 10);
    int mine = !shown && io.nonfinite >= 0, nonfinite;
    if (mine) nonfinite_error(nc, path, all, nall, vars, kinds(s), io.nonfinite, errs);
    MPI_Allreduce(&mine, &nonfinite, 1, MPI_INT, MPI_MAX, comm);
    shown += nonfinite;
    if (!shown && !overlap) {
      double t1 = util_now();
      share_pieces(s, 0);
      if (!lay->zero && s->opt) share_pieces(s, 1), share_pieces(s, 2); /* without ZeRO every replica keeps all moments */
      st->share_seconds = util_now() - t1;
    }
  }
  free(sums), free(total);
  io_release(&io); /* housekeeping, as the pruning after a write */
  return any ? 1 : shown;
}

/* After the tensors: Q from the file when it has one at this rank (else left as it is). Returns the
 * errors added (a damaged Q). */
static int read_lowrank(ckpt_state *s, int nc, const char *path, const gpt_tensor *all, int nall, err_list *errs) {
  int var;
  long long r = 0;
  if (ncmpi_inq_varid(nc, "comm_powersgd_q", &var) != NC_NOERR || ncmpi_get_att_longlong(nc, var, "rank", &r) != NC_NOERR ||
      r != s->comm_lowrank_rank)
    return 0;
  int bad = lowrank_io(nc, s, var, all, nall, 0) != NC_NOERR, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, s->lay->comm);
  q_span *sp = util_malloc((size_t)nall * sizeof *sp, "Q spans");
  size_t total;
  unsigned long long want = 0, got = q_checksum(s, sp, q_spans(s, all, nall, sp, &total));
  free(sp);
  ncmpi_get_att_ulonglong(nc, var, "checksum", &want);
  if (!any && want == got) return 0;
  err_add(errs, path, 0, 0, DAMAGED_HINT, "PowerSGD's warm start comm_powersgd_q is %s",
          any ? "unreadable" : "damaged (checksum mismatch)");
  return 1;
}

/* After the tensors: the residual from the file when its replicas held theirs as this job's do (the
 * attribute `holders`; without it, each over all its values) (st->residual 1), else zero
 * (st->residual 0, st->residual_held how the file's were held). Returns the errors added (a damaged
 * residual). */
static int read_residual(ckpt_state *s, int nc, const char *path, const gpt_tensor *all, int nall, ckpt_stats *st,
                         err_list *errs) {
  memset(s->comm_residual, 0, s->model->nparams * sizeof(float));
  st->residual = 0;
  st->residual_held[0] = 0;
  size_t N = row_length(all, nall);
  int var, dim;
  long long D = 0;
  MPI_Offset len = 0;
  if (ncmpi_inq_varid(nc, "comm_residual", &var) != NC_NOERR || ncmpi_get_att_longlong(nc, var, "replicas", &D) != NC_NOERR ||
      ncmpi_inq_vardimid(nc, var, &dim) != NC_NOERR || ncmpi_inq_dimlen(nc, dim, &len) != NC_NOERR ||
      len != (MPI_Offset)(D * (long long)N))
    return 0;
  ncfile_get_text(nc, var, "holders", st->residual_held, sizeof st->residual_held);
  if (!st->residual_held[0]) grad_holders_one_level(D, st->residual_held, sizeof st->residual_held);
  if (D != s->lay->D || strcmp(st->residual_held, s->comm_residual_holders ? s->comm_residual_holders : "") != 0) return 0;
  st->residual_held[0] = 0;
  uint64_t sum = 0, total = 0;
  unsigned long long want = 0;
  io_stream io;
  io_open(&io, nc, 0, s, &sum, 1, path, s->lay->comm);
  residual_ranges(&io, s, var, all, nall, 0, 1);
  io_start(&io, path, &s->cfg->checkpoint);
  residual_ranges(&io, s, var, all, nall, 0, 0);
  io_close(&io);
  io_release(&io);
  int bad = io.rc != NC_NOERR, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, s->lay->comm);
  MPI_Allreduce(&sum, &total, 1, MPI_UINT64_T, MPI_SUM, s->lay->comm);
  ncmpi_get_att_ulonglong(nc, var, "checksum", &want);
  if (any || want != total) {
    err_add(errs, path, 0, 0, DAMAGED_HINT, "the error-feedback residual comm_residual is %s",
            any ? "unreadable" : "damaged (checksum mismatch)");
    return 1;
  }
  st->residual = 1;
  return 0;
}

int ckpt_read(ckpt_state *s, const char *path, ckpt_stats *st, err_list *errs) {
  MPI_Comm comm = s->lay->comm;
  double t0 = util_now();
  long n0 = err_count(errs);
  int nc, damaged = 0;
  st->share_seconds = 0, st->direct = 0, st->damaged = 0, st->residual = -1, st->residual_held[0] = 0;
  if (st->path != path) util_snprintf(st->path, sizeof st->path, "%s", path);
  gpt_shape shape;
  gpt_shape_from_cfg(&shape, &s->cfg->model);
  int nall;
  gpt_tensor *all = gpt_list_tensors(&shape, gpt_whole(&shape), &nall);
  int *vars = util_malloc((size_t)nall * 3 * sizeof *vars, "variables");
  if (open_checkpoint(s, path, &nc, &damaged, errs) == 0) {
    check_shape(nc, s, path, all, nall, vars, errs);
    if (err_count(errs) == n0) check_state(s, nc, path, &damaged, errs);
    int bad = err_count(errs) > n0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (!any && read_tensors(s, nc, path, all, nall, vars, st, errs) > 0) damaged = 1;
    else if (!any && s->comm_residual && read_residual(s, nc, path, all, nall, st, errs) > 0) damaged = 1;
    if (!any && !damaged && s->comm_lowrank_q && read_lowrank(s, nc, path, all, nall, errs) > 0) damaged = 1;
    ncmpi_close(nc);
  }
  st->bytes = 3.0 * sizeof(float) * (double)gpt_count_params(&shape);
  free(all), free(vars);
  gpt_shape_free(&shape);
  st->seconds = util_now() - t0;
  int mine[2] = {(int)(err_count(errs) - n0), damaged}, most[2]; /* the same answer on every rank */
  MPI_Allreduce(mine, most, 2, MPI_INT, MPI_MAX, comm);
  st->damaged = most[0] > 0 && most[1];
  return most[0];
}
