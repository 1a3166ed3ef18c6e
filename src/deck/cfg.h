/* cfg: the deck's groups as tables, and the typed configuration they fill.
 *
 * Each group is one X-macro list of (type, key, default, range, doc). From it come the C struct
 * field, the parser binding, the range check, the resolved-deck echo and doc/deck-reference.md;
 * nothing else lists the keys. Defaults are written as deck text and parsed like user input.
 * A range is an interval ("[1, 4096]", "(0, 1]", "[0, inf)") for numbers, or a set of allowed
 * words ("cosine|linear|constant") for strings and string lists; "" means unrestricted. */
#ifndef GREENLM_CFG_H
#define GREENLM_CFG_H

#include <stddef.h>
#include <stdio.h>

#include "deck/nml.h"

#define CFG_STR_LEN 1024
#define CFG_LIST_MAX 64
#define CFG_ITEM_LEN 1024

typedef struct {
  int n;
  char v[CFG_LIST_MAX][CFG_ITEM_LEN];
} cfg_strlist;

typedef struct {
  int n;
  double v[CFG_LIST_MAX];
} cfg_reallist;

/* ---- choices ------------------------------------------------------------------------------------
 * The words of each choice key, each with its enum constant, X(CONSTANT, "word"), in the order the
 * range lists them. The key's range is made from the list (CFG_CHOICES), and so is the enum
 * cfg_GROUP_KEY with cfg_GROUP_KEY_of(group) (CFG_CHOICE_KEYS): code switches on the constants and
 * never compares the words. Keys whose words name rows of a data table (&energy region, &machine
 * device) are looked up in that table instead. */
#define CFG_TASKS(X)                                                                                  \
  X(CFG_TASK_TOKENIZER, "tokenizer") X(CFG_TASK_PREPARE, "prepare") X(CFG_TASK_PLAN, "plan")            \
  X(CFG_TASK_TRAIN, "train") X(CFG_TASK_EVAL, "eval") X(CFG_TASK_SAMPLE, "sample") X(CFG_TASK_EXPORT, "export")
#define CFG_ARCHS(X) X(CFG_ARCH_GPT_NEO, "gpt-neo") X(CFG_ARCH_GPT2, "gpt2") X(CFG_ARCH_GPT_NEOX, "gpt-neox") X(CFG_ARCH_LLAMA, "llama")
#define CFG_ACTIVATIONS(X) X(CFG_ACT_AUTO, "auto") X(CFG_ACT_GELU_NEW, "gelu_new") X(CFG_ACT_GELU, "gelu")
#define CFG_HEADS(X) X(CFG_HEAD_AUTO, "auto") X(CFG_HEAD_TIED, "tied") X(CFG_HEAD_UNTIED, "untied")
#define CFG_ROPE_SCALINGS(X) X(CFG_ROPE_NONE, "none") X(CFG_ROPE_LLAMA3, "llama3")
#define CFG_LR_DECAYS(X) X(CFG_DECAY_COSINE, "cosine") X(CFG_DECAY_LINEAR, "linear") X(CFG_DECAY_CONSTANT, "constant")
#define CFG_TOKENIZER_KINDS(X) X(CFG_TOK_BYTES, "bytes") X(CFG_TOK_BPE, "bpe")
#define CFG_DOCUMENTS(X)                                                                              \
  X(CFG_DOCS_FILE, "file") X(CFG_DOCS_LINE, "line") X(CFG_DOCS_BLANK_LINE, "blank_line")                \
  X(CFG_DOCS_SEPARATOR_LINE, "separator_line")
#define CFG_FORMATS(X) X(CFG_FORMAT_AUTO, "auto") X(CFG_FORMAT_TEXT, "text") X(CFG_FORMAT_JSONL, "jsonl")
#define CFG_BAD_RECORDS(X) X(CFG_BAD_SKIP, "skip") X(CFG_BAD_FATAL, "fatal")
#define CFG_RANK_ORDERS(X) X(CFG_ORDER_REPLICAS_ADJACENT, "replicas_adjacent") X(CFG_ORDER_STAGES_ADJACENT, "stages_adjacent")
#define CFG_BINDS(X) X(CFG_BIND_AUTO, "auto") X(CFG_BIND_NONE, "none")
#define CFG_COMM_METHODS(X)                                                                           \
  X(CFG_COMM_NONE, "none") X(CFG_COMM_QSGD, "qsgd") X(CFG_COMM_QSGDINF, "qsgdinf") X(CFG_COMM_NUQSGD, "nuqsgd") \
  X(CFG_COMM_MINMAX, "minmax") X(CFG_COMM_ALQ, "alq") X(CFG_COMM_AMQ, "amq") X(CFG_COMM_TOPK, "topk") \
  X(CFG_COMM_POWERSGD, "powersgd")
#define CFG_EXCHANGES(X) X(CFG_EXCHANGE_ALLGATHER, "allgather") X(CFG_EXCHANGE_SRA, "sra") X(CFG_EXCHANGE_INTSUM, "intsum")
#define CFG_HIERARCHIES(X) X(CFG_HIER_NONE, "none") X(CFG_HIER_NODE, "node")
#define CFG_DTYPES(X) X(CFG_DTYPE_FP32, "fp32") X(CFG_DTYPE_BF16, "bf16") X(CFG_DTYPE_FP16, "fp16")
#define CFG_BACKENDS(X) X(CFG_BACKEND_AUTO, "auto") X(CFG_BACKEND_CPU, "cpu") X(CFG_BACKEND_CUDA, "cuda")
#define CFG_PRECISIONS(X) X(CFG_PREC_FP32, "fp32") X(CFG_PREC_TF32, "tf32") X(CFG_PREC_BF16, "bf16") X(CFG_PREC_FP16, "fp16")
#define CFG_ATTRIBUTIONS(X) X(CFG_ATTRIB_EQUAL, "equal") X(CFG_ATTRIB_CPU_TIME, "cpu_time")

#define CFG_RANGE_WORD(E, w) "|" w
#define CFG_CHOICES(LIST) (LIST(CFG_RANGE_WORD) + 1) /* "a|b|c": the list without its first '|' */

/* The choice keys of one word each: X(group, key, LIST). */
#define CFG_CHOICE_KEYS(X)                                                                            \
  X(model, arch, CFG_ARCHS) X(model, activation, CFG_ACTIVATIONS) X(model, head, CFG_HEADS) X(model, rope_scaling, CFG_ROPE_SCALINGS) X(training, lr_decay, CFG_LR_DECAYS) X(tokenizer, kind, CFG_TOKENIZER_KINDS) \
  X(prepare, documents, CFG_DOCUMENTS) X(prepare, format, CFG_FORMATS) X(prepare, bad_records, CFG_BAD_RECORDS) \
  X(parallel, rank_order, CFG_RANK_ORDERS) X(parallel, bind, CFG_BINDS) X(comm, method, CFG_COMM_METHODS)  \
  X(comm, exchange, CFG_EXCHANGES) X(comm, hierarchy, CFG_HIERARCHIES) X(export, dtype, CFG_DTYPES) X(system, backend, CFG_BACKENDS)           \
  X(system, precision, CFG_PRECISIONS) X(energy, attribution, CFG_ATTRIBUTIONS)

#define CFG_ENUM_ITEM(E, w) E,
typedef enum { CFG_TASKS(CFG_ENUM_ITEM) CFG_NTASKS } cfg_task;
#define CFG_CHOICE_ENUM(g, key, LIST) typedef enum { LIST(CFG_ENUM_ITEM) } cfg_##g##_##key;
CFG_CHOICE_KEYS(CFG_CHOICE_ENUM)
#undef CFG_CHOICE_ENUM

/* ---- the groups ------------------------------------------------------------------------------ */

#define CFG_GROUP_JOB(X, g)                                                                           \
  X(g, STRLIST, task, "'train'", CFG_CHOICES(CFG_TASKS), "What the run does, in this order: 'tokenizer' learns a BPE vocabulary (&tokenizer), 'prepare' turns text into token datasets (&prepare), 'plan' predicts the training run's memory, time, energy and CO2e on the machine of &machine for every layout and recommends one (doc/planning.md; nothing is trained), 'train' trains the model on &data, 'eval' scores a model on a dataset and benchmarks (&eval), 'sample' generates text (&sample), 'export' writes a Hugging Face model directory (&export). eval, sample and export take the model from &checkpoint restart, else the newest checkpoint in &checkpoint dir, else &model init_from") \
  X(g, STR, name, "'greenlm'", "", "Name of the run, used in reports")                               \
  X(g, STR, run_dir, "'runs/default'", "", "Directory that receives deck.resolved.nml, log.txt, metrics.csv and verdict.json") \
  X(g, BOOL, overwrite, ".false.", "", "Allow a run directory that already holds a finished run's files to be reused") \
  X(g, INT, seed, "1234", "[0, 9007199254740991]", "Seed of parameter initialisation, data order and sampling") \
  X(g, INT, log_every, "10", "[1, inf)", "Optimizer steps between progress lines and metrics.csv rows") \
  X(g, BOOL, watchdog, ".true.", "", "Watch a training job: a rank that stops answering (stopped, dead, or a frozen node), or a job in which no rank makes progress (a deadlock, a stalled device or file system), ends the job with a message naming the rank (exit status 5), instead of a hang until the batch system's time limit") \
  X(g, REAL, step_timeout, "0", "[0, inf)", "The watchdog's limit: seconds a training job may go without any rank making progress (a forward or backward pass, a checkpoint batch, an MPI-IO call) or with a rank silent; 0 makes it adaptive: max(watchdog_floor, 10 x the slowest such phase seen since the first step), and at least 1800 s before the first step") \
  X(g, REAL, watchdog_floor, "180", "[1, inf)", "The adaptive watchdog limit's least value in seconds (step_timeout = 0)")

#define CFG_GROUP_MODEL(X, g)                                                                         \
  X(g, STR, arch, "'gpt-neo'", CFG_CHOICES(CFG_ARCHS), "Architecture: 'gpt-neo' (unscaled scores, no q/k/v bias, global/local layers), 'gpt2' (scaled scores, q/k/v bias, all global) or 'gpt-neox' (Pythia, GPT-NeoX-20B: rotary embeddings instead of wpe, scaled scores, all global, the parallel residual, an untied head) or 'llama' (Llama 2 and 3: RMSNorm, rotary embeddings on every dim of a head, scaled scores, all global, the SwiGLU MLP, an untied head, grouped-query attention with n_kv_head)") \
  X(g, INT, vocab_size, "50257", "[2, 16777216]", "Vocabulary size V (rows of the tied token embedding wte)") \
  X(g, INT, block_size, "2048", "[1, 1048576]", "Longest sequence the model can see: rows of the position embedding wpe") \
  X(g, INT, n_layer, "12", "[1, 4096]", "Number of transformer blocks L")                          \
  X(g, INT, n_embd, "768", "[1, 1048576]", "Hidden size C")                                        \
  X(g, INT, n_head, "12", "[1, 4096]", "Attention heads H; head size is C/H")                      \
  X(g, INT, n_kv_head, "0", "[0, 4096]", "llama: key/value heads (Hugging Face's num_key_value_heads), each shared by n_head / n_kv_head query heads (grouped-query attention); 0 means n_head (multi-head attention)") \
  X(g, INT, n_inner, "0", "[0, 4194304]", "MLP hidden size (llama: Hugging Face's intermediate_size, the units of gate and of up); 0 means 4*n_embd")                     \
  X(g, STRLIST, attention_types, "'global', 'local'", "global|local", "Attention kind of each layer, as a pattern repeated over the layers; left unset it is 'global' for every architecture but gpt-neo (only GPT-Neo has local layers)") \
  X(g, INT, window_size, "256", "[1, 1048576]", "Keys a 'local' layer sees: query i attends to keys j with i - window_size < j <= i") \
  X(g, REAL, layer_norm_epsilon, "1e-5", "(0, 1)", "Epsilon of every LayerNorm (llama: of every RMSNorm, Hugging Face's rms_norm_eps)")                   \
  X(g, REAL, init_std, "0.02", "(0, 10]", "Standard deviation of the normal initialisation of weights and embeddings") \
  X(g, STR, activation, "'auto'", CFG_CHOICES(CFG_ACTIVATIONS), "The MLP's activation: 'gelu_new' (the tanh form; Hugging Face's gelu_new and gelu_fast) or 'gelu' (the exact erf form); 'auto' is gelu_new for gpt-neo and gpt2, gelu for gpt-neox; llama's MLP is SwiGLU (silu), 'auto' only") \
  X(g, STR, head, "'auto'", CFG_CHOICES(CFG_HEADS), "The LM head: 'tied' to the token embedding, or 'untied', a matrix of its own (Hugging Face's tie_word_embeddings = false); 'auto' is tied for gpt-neo and gpt2, untied for gpt-neox and llama") \
  X(g, REAL, rotary_pct, "0.25", "[0, 1]", "gpt-neox: share of each head's dims that the rotary position embedding turns (Hugging Face's rotary_pct, partial_rotary_factor); head size x rotary_pct, rounded down, must be even") \
  X(g, REAL, rotary_emb_base, "10000", "[1, 1e12]", "gpt-neox and llama: base of the rotary embedding's frequencies (Hugging Face's rotary_emb_base, rope_theta)") \
  X(g, BOOL, use_parallel_residual, ".true.", "", "gpt-neox: each block adds attention and MLP of the same input, x + attn(ln_1(x)) + mlp(ln_2(x)) (as Pythia and GPT-NeoX-20B); .false.: one after the other") \
  X(g, BOOL, attention_bias, ".true.", "", "gpt-neox and llama: the attention's projections have biases (Hugging Face's attention_bias: gpt-neox's query_key_value and dense, llama's q, k, v and o_proj); left unset it is .false. for llama, as Hugging Face's LlamaConfig") \
  X(g, BOOL, mlp_bias, ".false.", "", "llama: gate_proj, up_proj and down_proj have biases (Hugging Face's mlp_bias)") \
  X(g, STR, rope_scaling, "'none'", CFG_CHOICES(CFG_ROPE_SCALINGS), "llama: the rotary frequencies' scaling: 'none', or 'llama3' (Llama 3.1 and later; Hugging Face's rope_scaling or rope_parameters of rope_type llama3): a pair whose wavelength exceeds rope_original_positions / rope_low_freq_factor turns rope_factor times slower, one below rope_original_positions / rope_high_freq_factor as it is, one between at a blend") \
  X(g, REAL, rope_factor, "8", "[1, 1e6]", "llama with rope_scaling = 'llama3': how many times slower the low frequencies turn (Hugging Face's factor)") \
  X(g, REAL, rope_low_freq_factor, "1", "(0, 1e6]", "llama with rope_scaling = 'llama3': Hugging Face's low_freq_factor") \
  X(g, REAL, rope_high_freq_factor, "4", "(0, 1e6]", "llama with rope_scaling = 'llama3': Hugging Face's high_freq_factor (more than rope_low_freq_factor)") \
  X(g, INT, rope_original_positions, "8192", "[1, 1048576]", "llama with rope_scaling = 'llama3': the context the model was first trained for (Hugging Face's original_max_position_embeddings)") \
  X(g, STR, init_from, "''", "", "Directory of a Hugging Face model (config.json, model.safetensors or a sharded model.safetensors.index.json; tokenizer.json, or vocab.json and merges.txt) whose weights start the run instead of the random initialisation; its config.json must agree with this group (doc/interop.md). A checkpoint to restart from takes precedence")

#define CFG_GROUP_TRAINING(X, g)                                                                      \
  X(g, INT, seq_len, "128", "[1, 1048576]", "Tokens per training sequence T (at most block_size)")  \
  X(g, INT, micro_batch_size, "4", "[1, 1048576]", "Sequences per micro-batch B (one forward/backward pass)") \
  X(g, INT, global_batch_size, "0", "[0, 1073741824]", "Sequences per optimizer step; a multiple of micro_batch_size (gradients are accumulated); 0 means micro_batch_size") \
  X(g, INT, max_steps, "1000", "[1, inf)", "Optimizer steps to train")                              \
  X(g, REAL, max_minutes, "0", "[0, inf)", "Stop training (with the end-of-run verdict) after this many minutes of wall time; 0 means no limit") \
  X(g, REAL, lr, "6e-4", "(0, 10]", "Peak learning rate")                                           \
  X(g, REAL, min_lr, "6e-5", "[0, 10]", "Learning rate at the end of the decay (the floor)")       \
  X(g, INT, warmup_steps, "100", "[0, inf)", "Steps of linear warm-up from lr/warmup_steps to lr") \
  X(g, STR, lr_decay, "'cosine'", CFG_CHOICES(CFG_LR_DECAYS), "Decay from lr to min_lr after the warm-up") \
  X(g, INT, decay_steps, "0", "[0, inf)", "Step at which the decay reaches min_lr; 0 means max_steps") \
  X(g, REAL, beta1, "0.9", "[0, 1)", "AdamW first-moment decay")                                    \
  X(g, REAL, beta2, "0.95", "[0, 1)", "AdamW second-moment decay")                                  \
  X(g, REAL, adam_eps, "1e-8", "(0, 1)", "AdamW epsilon")                                           \
  X(g, REAL, weight_decay, "0.1", "[0, 10]", "Decoupled weight decay of the weight matrices and embeddings (never biases or LayerNorm parameters)") \
  X(g, REAL, grad_clip, "1.0", "[0, inf)", "Clip the global gradient norm to this value; 0 disables clipping") \
  X(g, BOOL, recompute, ".false.", "", "Activation recomputation: keep only each transformer block's input per micro-batch and recompute the block's inner activations in the backward pass (less memory, about a quarter more compute)") \
  X(g, INT, eval_every, "100", "[0, inf)", "Steps between validation-loss evaluations; 0 evaluates only at the end") \
  X(g, INT, eval_batches, "8", "[1, inf)", "Micro-batches of validation data per evaluation")

#define CFG_GROUP_TOKENIZER(X, g)                                                                  \
  X(g, STR, kind, "'bytes'", CFG_CHOICES(CFG_TOKENIZER_KINDS), "'bytes': one token per byte (vocabulary 256); 'bpe': byte-level BPE from dir/encoder.json and dir/vocab.bpe (GPT-2's files or a learned vocabulary), or a Hugging Face tokenizer.json (GPT-2's, GPT-NeoX's, Llama 3's; doc/interop.md)") \
  X(g, STR, dir, "''", "", "Directory of encoder.json and vocab.bpe; without them, of a Hugging Face tokenizer.json or else vocab.json and merges.txt: read by 'bpe', written by the 'tokenizer' task; empty with &model init_from means that directory") \
  X(g, INT, vocab_size, "4096", "[258, 16777216]", "Vocabulary the 'tokenizer' task learns, <|endoftext|> included") \
  X(g, STRLIST, corpus, "", "", "Text the 'tokenizer' task learns from (files, directories, glob patterns); empty means &prepare input")

#define CFG_GROUP_PREPARE(X, g)                                                                    \
  X(g, STRLIST, input, "", "", "Text to turn into token datasets: files, directories (their files) or glob patterns") \
  X(g, STR, documents, "'file'", CFG_CHOICES(CFG_DOCUMENTS), "How the text divides into documents: one per 'file', one per 'line', separated by blank lines ('blank_line') or by lines equal to separator ('separator_line')") \
  X(g, STR, separator, "'<|endoftext|>'", "", "The separator line of documents = 'separator_line'") \
  X(g, STR, format, "'auto'", CFG_CHOICES(CFG_FORMATS), "What the input files hold: 'text', or 'jsonl' (JSON Lines: one document per line, its text in the field text_field, as The Pile and exported Hugging Face datasets have it); 'auto' takes JSON Lines for names ending in .jsonl, .ndjson or .json (before a .gz or .zst) and text otherwise. gzip and zstd compression is recognised by the files' first bytes, whatever their names") \
  X(g, STR, text_field, "'text'", "", "The field of each JSON Lines record that holds its document's text") \
  X(g, STR, bad_records, "'skip'", CFG_CHOICES(CFG_BAD_RECORDS), "A JSON Lines record that is not a JSON object, lacks text_field, has a non-string there or invalid UTF-8: 'skip' counts it, names the first one, and goes on; 'fatal' reports each (file and line) and writes nothing. A line longer than a quarter of buffer_mb (at least 1024 bytes) counts as a bad record, in every format") \
  X(g, REAL, val_fraction, "0.05", "[0, 0.5]", "Share of the documents held out for validation (chosen by a seeded shuffle)") \
  X(g, REAL, buffer_mb, "1024", "(0, 1e9]", "MiB of tokens a rank holds while preparing; beyond them its tokens wait in a spill file beside train_out (about the datasets' size on disk, removed at the end), and the datasets are written in rounds of this size, so memory does not grow with the corpus; a line may hold at most a quarter of it (at least 1024 bytes)") \
  X(g, STR, train_out, "''", "", "Training dataset to write (NetCDF)")                             \
  X(g, STR, val_out, "''", "", "Validation dataset to write (NetCDF)")

#define CFG_GROUP_DATA(X, g)                                                                       \
  X(g, STRLIST, train, "", "", "Training datasets (NetCDF, from the 'prepare' task); several make a blend, each drawn with its share train_weights (doc/data.md); empty means &prepare train_out") \
  X(g, REALLIST, train_weights, "", "(0, inf)", "Share of the training windows drawn from each dataset of train, in its order (normalised to sum 1); empty weights each dataset by its size (its windows of seq_len + 1 tokens)") \
  X(g, STRLIST, val, "", "", "Validation datasets; several make a blend: each evaluation scores eval_batches micro-batches of every one, and the validation loss is their mean weighted by val_weights (doc/data.md); empty means &prepare val_out") \
  X(g, REALLIST, val_weights, "", "(0, inf)", "Weight of each dataset of val in the validation loss, in its order (normalised to sum 1): the loss is that of a window drawn from the blend; empty weights each dataset by its size (its windows of seq_len + 1 tokens)") \
  X(g, BOOL, prefetch, ".true.", "", "While a step runs, ask the operating system to read the next step's training windows of this rank into the page cache (posix_fadvise WILLNEED), so that its reads come from memory; .false. reads each window from the file when its micro-batch needs it (doc/data.md)") \
  X(g, BOOL, verify, ".true.", "", "Read the datasets once at start-up, shared among the ranks, and check every token id against the vocabulary and every block of 2^20 tokens against its checksum; .false. checks the headers and the file sizes only") \
  X(g, BOOL, trace_windows, ".false.", "", "Write every training step's windows to windows.csv in the run directory, a row each: step, position in the step (replica r's micro-batch k holds positions (r m + k) B to (r m + k + 1) B - 1), dataset (its index in train, from 0), window in that dataset and its first token (window x seq_len); so another trainer can be fed the same data in the same order (doc/data.md, run/reference-train)")

#define CFG_GROUP_PARALLEL(X, g)                                                                   \
  X(g, INT, pipeline_stages, "1", "[1, 4096]", "Pipeline stages P: the layers are split into P consecutive groups, one per rank of a pipeline") \
  X(g, INT, tensor_parallel, "1", "[1, 4096]", "Tensor-parallel ranks tp: each layer's heads, MLP units and vocabulary rows are split across tp consecutive ranks (doc/parallel.md); n_head and n_inner must be multiples of T") \
  X(g, INT, data_parallel, "0", "[0, 1048576]", "Data-parallel replicas D; 0 means ranks / (pipeline_stages x tensor_parallel). P x tp x D must equal the rank count") \
  X(g, INT, micro_batches, "0", "[0, 1048576]", "Micro-batches m per optimizer step on each replica; 0 means global_batch_size / (micro_batch_size x D)") \
  X(g, INT, zero_stage, "0", "[0, 1]", "0: every replica keeps all optimizer state; 1: AdamW state sharded across the replicas of a stage (ZeRO-1)") \
  X(g, STR, rank_order, "'replicas_adjacent'", CFG_CHOICES(CFG_RANK_ORDERS), "Which ranks are consecutive: the D replicas of a stage ('replicas_adjacent') or the P stages of a pipeline ('stages_adjacent')") \
  X(g, REAL, bucket_mb, "25", "(0, 1e6]", "Size in MiB of the gradient buckets exchanged across replicas while the backward pass goes on") \
  X(g, STR, bind, "'auto'", CFG_CHOICES(CFG_BINDS), "'auto': bind each rank to its own cores with hwloc unless the launcher already did; 'none': leave binding alone")

#define CFG_GROUP_COMM(X, g)                                                                       \
  X(g, STR, method, "'none'", CFG_CHOICES(CFG_COMM_METHODS), "Gradient compression across the data-parallel replicas, unbiased stochastic quantization of each bucket (doc/compression.md): 'none' (fp32), 'qsgd' (L2 norm, uniform levels), 'qsgdinf' (max norm, uniform levels), 'nuqsgd' (L2 norm, exponential levels with a zero level), 'minmax' (the bucket's range in 2^bits - 1 equal steps), 'alq' and 'amq' (L2 norm, levels fitted to the gradients' statistics on the adapt_every schedule, starting from NUQSGD's); 'topk' (sparsification: each bucket's topk_fraction largest magnitudes as indices and fp32 values, with error_feedback); 'powersgd' (low rank: each matrix's gradient as rank-powersgd_rank factors P Q^T from one power iteration warm-started from the last step, with error_feedback; vectors in fp32)") \
  X(g, INT, bits, "4", "[2, 32]", "Bits per gradient value, the sign included: 2 to 8, or 32 (no compression, the fp32 exchange itself)") \
  X(g, INT, quant_bucket, "0", "[0, 1048576]", "Values per quantization bucket (one scale each; buckets never cross tensors); 0: 8192 with the L2 norm (qsgd, nuqsgd, alq, amq) and for topk, 512 otherwise") \
  X(g, REAL, topk_fraction, "0.01", "(0, 1]", "topk: the share of each bucket's values sent (its largest magnitudes), at least one per bucket") \
  X(g, INT, powersgd_rank, "4", "[1, 256]", "powersgd: the rank r of each matrix's factors; a matrix whose factors would not be half its size or less travels in fp32. At most n_embd / 4") \
  X(g, INT, min_numel, "10000", "[0, inf)", "Tensors with fewer values (LayerNorm parameters, biases) travel uncompressed in the same message") \
  X(g, INT, warmup_steps, "0", "[0, inf)", "Steps exchanged uncompressed (fp32) at the start of training") \
  X(g, BOOL, error_feedback, ".false.", "", "Each replica carries what quantization dropped of its gradients into its next message (e = p - Q(p), p = g + e): the residual costs the stage's parameter count in fp32 host memory and is kept in checkpoints") \
  X(g, INT, adapt_every, "0", "[0, inf)", "alq, amq: the levels are fitted after steps 0, 100 and 2000 and then every this many steps; 0: every max_steps / 10") \
  X(g, INT, error_every, "100", "[0, inf)", "Every this many steps, measure each replica's relative quantization error ||Q(g) - g||^2 / ||g||^2 beside its exact expectation (metrics.csv q_error, q_error_expected); 0: never") \
  X(g, STR, exchange, "'allgather'", CFG_CHOICES(CFG_EXCHANGES), "How compressed buckets travel: 'allgather' (every replica receives every replica's message, decodes and sums them in rank order: the same result on every replica); 'sra' (reduce-scatter/all-gather: each replica owns a D-th of every bucket, sums the replicas' parts of it, quantizes the sum again and all-gathers it: fewer bytes received at large D, a second rounding); 'intsum' (uniform levels only: a scale shared by the replicas, integers summed by MPI_Allreduce in 8 or 16 bits)") \
  X(g, STR, hierarchy, "'none'", CFG_CHOICES(CFG_HIERARCHIES), "The replicas' nodes: 'none' (one exchange among all replicas); 'node' (the replicas of a node reduce-scatter each bucket in fp32, each node's piece travels between the nodes as method and exchange say, and the sums are all-gathered inside the node: only what leaves a node is compressed; doc/compression.md)") \
  X(g, INT, ranks_per_node, "0", "[0, 16777216]", "Ranks of one node, for hierarchy = 'node' and the inter-node byte counts: ranks r with the same r / ranks_per_node share a node; 0: the ranks MPI says share memory (MPI_COMM_TYPE_SHARED)")

#define CFG_GROUP_CHECKPOINT(X, g)                                                                 \
  X(g, STR, dir, "''", "", "Directory of the checkpoints; empty means run_dir/checkpoints")     \
  X(g, INT, every_steps, "0", "[0, inf)", "Write a checkpoint every this many steps; 0: never by step count") \
  X(g, REAL, every_minutes, "0", "[0, inf)", "Write a checkpoint when this many minutes of wall time have passed since the last; 0: never by time") \
  X(g, BOOL, at_end, ".true.", "", "Write a checkpoint when training ends (completed, time limit or signal)") \
  X(g, INT, keep, "3", "[1, inf)", "Checkpoints kept in the directory; older ones are deleted after a new one is complete") \
  X(g, REAL, stage_mb, "8", "(0, 2047]", "Size in MiB of each rank's staging buffer: tensors pass through it to and from the file, one collective wait per buffer written (small enough to stay in the processor's cache)") \
  X(g, BOOL, direct_read, ".true.", "", "Read checkpoints straight from the disk, ahead of their use on a thread of their own (O_DIRECT: no page cache, no kernel copy); .false., or a file system that refuses it, reads through the page cache") \
  X(g, REAL, read_mb, "8", "(0, 2047]", "Size in MiB of each read request, and of each of the reader's 2 x read_requests buffers (no more than a rank's share of the checkpoint)") \
  X(g, INT, read_requests, "4", "[1, 64]", "Reads in flight per rank while a checkpoint is read (reader threads): several keep the disk busy") \
  X(g, STR, restart, "''", "", "Continue from a checkpoint: its path, or 'latest' (the newest in dir; none there starts from step 0)") \
  X(g, BOOL, fallback, ".true.", "", "With restart = 'latest': a damaged newest checkpoint is set aside (renamed .damaged) with a warning and the next older one is read; .false. stops with the errors instead")

#define CFG_GROUP_EVAL(X, g)                                                                          \
  X(g, STRLIST, val, "", "", "Token datasets scored window by window, every window of each (loss, perplexity, bits per byte); empty means &data val; 'none' skips them") \
  X(g, INT, seq_len, "0", "[0, 1048576]", "Tokens per window of that score (at most &model block_size); 0 means &training seq_len") \
  X(g, STRLIST, benchmarks, "", "", "Benchmark files as 'kind:path', kind one of lambada, hellaswag, piqa, arc, winogrande, mc (the generic {\"context\", \"choices\", \"label\"} form), e.g. 'lambada:data/lambada_test.jsonl' (doc/evaluation.md)") \
  X(g, INT, num_fewshot, "0", "[0, 64]", "Solved examples placed before each benchmark item (drawn with the seed from the same file, never the item itself)") \
  X(g, INT, limit, "0", "[0, inf)", "Items scored per benchmark, the first of the file; 0 means all") \
  X(g, BOOL, during_training, ".false.", "", "Also score the benchmarks at every &training eval_every evaluation of the 'train' task (the log's bench lines, bench.csv; pipeline_stages = 1; contexts cut to &training seq_len)")

#define CFG_GROUP_SAMPLE(X, g)                                                                        \
  X(g, INT, n_tokens, "200", "[0, inf)", "Tokens to generate per prompt (the 'sample' task, and after training); 0 skips the sample after training") \
  X(g, STR, prompt, "''", "", "Text the sample continues; empty starts from a newline")             \
  X(g, STR, prompt_file, "''", "", "File of prompts, one per line (\\n in a line stands for a newline), generated as one batch; replaces prompt") \
  X(g, REAL, temperature, "0.8", "[0, 100]", "Sampling temperature; 0 picks the most likely token (greedy)") \
  X(g, INT, top_k, "40", "[0, inf)", "Sample among the k most likely tokens; 0 means all")        \
  X(g, REAL, top_p, "1", "(0, 1]", "Nucleus sampling: among the most likely tokens whose probabilities add up to top_p; 1 means all") \
  X(g, REAL, repetition_penalty, "1", "(0, 100]", "Logits of tokens already in the text are divided by this (multiplied when negative), as Hugging Face's generate does; 1 means none") \
  X(g, STR, stop, "''", "", "Generation of a prompt stops when its text ends with this string (it is kept)") \
  X(g, BOOL, stop_eot, ".true.", "", "Generation of a prompt stops at <|endoftext|>")

#define CFG_GROUP_EXPORT(X, g)                                                                        \
  X(g, STR, dir, "''", "", "Directory the 'export' task writes (a Hugging Face model: config.json, model.safetensors, tokenizer files); empty means run_dir/hf") \
  X(g, STR, dtype, "'fp32'", CFG_CHOICES(CFG_DTYPES), "Element type of the exported weights") \
  X(g, REAL, shard_mb, "5000", "(0, 1e9]", "Largest model.safetensors file in MB (10^6 bytes); a larger model is split into model-0000i-of-0000n.safetensors with model.safetensors.index.json")

#define CFG_GROUP_SYSTEM(X, g)                                                                        \
  X(g, STR, backend, "'auto'", CFG_CHOICES(CFG_BACKENDS), "Compute backend: 'cpu' (OpenBLAS and C kernels), 'cuda' (cuBLAS and CUDA kernels; a build configured --with-cuda, doc/gpu.md), 'auto' (CUDA where built and a GPU is visible, else the CPU)") \
  X(g, STR, precision, "'fp32'", CFG_CHOICES(CFG_PRECISIONS), "Precision: 'fp32'; 'bf16' and 'fp16' store activations and the parameters' compute copy in 16 bits where the backend has that storage (the CPU does; master weights, gradients, AdamW and checkpoints stay fp32; fp16 with dynamic loss scaling), and run the CUDA GEMMs and attention on tensor cores; 'tf32' (CUDA): fp32 storage, TF32 GEMMs. The run header names the storage type") \
  X(g, REAL, loss_scale, "65536", "[1, 1e300]", "precision = 'fp16': initial loss scale; halved (and the step skipped) when the gradients overflow") \
  X(g, INT, loss_scale_window, "2000", "[1, inf)", "precision = 'fp16': good steps in a row after which the loss scale doubles") \
  X(g, BOOL, flush_subnormals, ".true.", "", "Flush subnormal floats (below 2^-126) to zero in the CPU's arithmetic: x86-64's FTZ and DAZ, Arm's FZ (POWER has no such mode); a trained model makes them, and without the flush its CPU steps took 3 times as long (doc/performance.md). The compute line of the run header says whether it holds") \
  X(g, INT, blas_threads, "1", "[0, 4096]", "OpenBLAS threads per rank; 0 gives each rank as many threads as it has cores (after binding)") \
  X(g, REAL, peak_gflops, "0", "[0, inf)", "Peak GFLOP/s of one rank for MFU; 0 measures a GEMM at start-up (at the GEMM precision; e.g. 989000 is an H100/H200's dense bf16 peak)")

#define CFG_GROUP_ENERGY(X, g)                                                                        \
  X(g, REAL, pue, "1.0", "[1, 10]", "Power usage effectiveness of the site (facility energy / IT energy); 1.0 counts the IT equipment only") \
  X(g, STR, region, "'world'", "world|usa|iso-ne|new-york|france|germany|quebec|sweden", "Grid whose carbon intensity applies, from the built-in table with its sources (doc/energy.md); grid_intensity overrides it") \
  X(g, REAL, grid_intensity, "0", "[0, 5000]", "Grid carbon intensity in gCO2e/kWh; 0 takes it from region") \
  X(g, BOOL, estimate, ".true.", "", "Where no sensor can be read, estimate the component and label it so: CPU from its model's TDP in the built-in table (or a per-core default) x greenlm's CPU time, DRAM per GB of memory x wall time, GPU from its board power x wall time (doc/energy.md); .false. reports it 'not measured' unless cpu_tdp_w or gpu_tdp_w is given") \
  X(g, REAL, cpu_tdp_w, "0", "[0, 100000]", "CPU power in W per node for a labelled estimate where RAPL is missing (W x utilisation), in place of the built-in table; 0 takes the table") \
  X(g, REAL, gpu_tdp_w, "0", "[0, 100000]", "GPU board power in W for a labelled estimate where NVML is missing (an upper bound), in place of the built-in table; 0 takes the table") \
  X(g, STR, attribution, "'equal'", CFG_CHOICES(CFG_ATTRIBUTIONS), "How a node's CPU and DRAM energy is shared among its ranks: equal shares, or shares of CPU time") \
  X(g, REAL, sample_seconds, "5", "[0.01, 60]", "Seconds between RAPL reads by the sampling thread (well below the counters' wrap time)")

#define CFG_GROUP_MACHINE(X, g)                                                                       \
  X(g, INT, nodes, "1", "[1, 1048576]", "Nodes of the machine the 'plan' task plans for") \
  X(g, STR, device, "'cpu'", "cpu|v100-16gb|v100-32gb|a100-40gb|a100-80gb|h100-80gb|h200", "What each rank computes on, from the built-in table with its sources (doc/planning.md): a GPU model, or 'cpu' (one rank per core)") \
  X(g, INT, devices_per_node, "0", "[0, 4096]", "GPUs per node, or cores per node for 'cpu' (one rank each); 0: 8 GPUs, or this machine's cores") \
  X(g, REAL, memory_gb, "0", "[0, 1e9]", "Memory of one rank in GB (10^9 bytes); 0: the device's from the table, or for 'cpu' this node's memory shared by its ranks") \
  X(g, REAL, peak_tflops, "0", "[0, 1e9]", "Peak TFLOP/s of one rank at the deck's precision; 0: the table's, or for 'cpu' a GEMM measured here on one core") \
  X(g, REAL, efficiency, "0", "[0, 1]", "Share of the peak the forward and backward passes reach; 0: the table's (what greenlm measured on that device, doc/performance.md)") \
  X(g, REAL, memory_gbs, "0", "[0, 1e9]", "Memory bandwidth of one rank in GB/s (the optimizer step is bound by it); 0: the table's") \
  X(g, REAL, intra_gbs, "0", "[0, 1e9]", "Bandwidth between two ranks of a node, GB/s each way; 0: the table's (NVLink, or shared memory)") \
  X(g, REAL, intra_latency_us, "0", "[0, 1e9]", "Latency of a message between two ranks of a node, microseconds; 0: the table's") \
  X(g, REAL, inter_gbs, "0", "[0, 1e9]", "Network bandwidth of a node, GB/s each way, shared by its ranks; 0: 25 (two 100 Gb/s InfiniBand EDR rails)") \
  X(g, REAL, inter_latency_us, "0", "[0, 1e9]", "Latency of a message between nodes, microseconds; 0: 2") \
  X(g, REAL, device_watts, "0", "[0, 1e6]", "Board power of one GPU, or power of one core for 'cpu', in W; 0: the table's") \
  X(g, REAL, host_watts, "0", "[0, 1e6]", "Power of a GPU node besides its GPUs (processors, memory, network), W; 0: 150 per GPU") \
  X(g, REAL, overhead_gb, "0", "[0, 1e9]", "Memory of a rank outside the planned buffers (GPU: CUDA context and libraries; CPU: the process, MPI, libraries), GB; 0: the table's") \
  X(g, REAL, tokens, "0", "[0, 1e18]", "Tokens the planned run trains on; 0: 20 per parameter (compute-optimal)") \
  X(g, STR, source, "''", "", "Where the figures of this machine come from (a machine file, a calibration), echoed in the plan")

/* Every group, in deck order: X(name, NAME_MACRO, doc) */
#define CFG_GROUPS(X)                                                                              \
  X(job, CFG_GROUP_JOB, "The run: task, run directory, seed and logging")                        \
  X(model, CFG_GROUP_MODEL, "The network: a GPT-Neo, GPT-2 or GPT-NeoX decoder")                         \
  X(training, CFG_GROUP_TRAINING, "Batches, schedule, AdamW and evaluation")                      \
  X(tokenizer, CFG_GROUP_TOKENIZER, "The tokenizer, and the vocabulary the 'tokenizer' task learns") \
  X(prepare, CFG_GROUP_PREPARE, "Text to token datasets: inputs, documents, validation split")      \
  X(data, CFG_GROUP_DATA, "The token datasets training reads")                                    \
  X(parallel, CFG_GROUP_PARALLEL, "MPI decomposition: pipeline stages x tensor-parallel ranks x data-parallel replicas, ZeRO-1, binding") \
  X(comm, CFG_GROUP_COMM, "Compressed gradient exchange across the data-parallel replicas")      \
  X(checkpoint, CFG_GROUP_CHECKPOINT, "PnetCDF checkpoints: when to write them, how many to keep, restarting") \
  X(eval, CFG_GROUP_EVAL, "Scoring a model: a dataset's loss, perplexity and bits per byte; benchmarks") \
  X(sample, CFG_GROUP_SAMPLE, "Text generation: the 'sample' task, and the sample after training") \
  X(export, CFG_GROUP_EXPORT, "The Hugging Face model directory the 'export' task writes")       \
  X(system, CFG_GROUP_SYSTEM, "Backend, threads and the peak used for MFU")                     \
  X(energy, CFG_GROUP_ENERGY, "Energy accounting: site PUE, grid intensity, estimates")             \
  X(machine, CFG_GROUP_MACHINE, "The machine the 'plan' task plans a training run for: nodes, devices, links")

/* ---- generated structs ----------------------------------------------------------------------- */

#define CFG_FIELD_INT(n) long n;
#define CFG_FIELD_REAL(n) double n;
#define CFG_FIELD_BOOL(n) int n;
#define CFG_FIELD_STR(n) char n[CFG_STR_LEN];
#define CFG_FIELD_STRLIST(n) cfg_strlist n;
#define CFG_FIELD_REALLIST(n) cfg_reallist n;
#define CFG_FIELD(g, type, n, def, range, doc) CFG_FIELD_##type(n)
#define CFG_STRUCT(gname, GMACRO, gdoc) typedef struct { GMACRO(CFG_FIELD, gname) } cfg_##gname;
CFG_GROUPS(CFG_STRUCT)
#undef CFG_STRUCT

#define CFG_COUNT(g, type, n, def, range, doc) +1
#define CFG_GROUP_COUNT(gname, GMACRO, gdoc) GMACRO(CFG_COUNT, gname)
enum { CFG_NKEYS = 0 CFG_GROUPS(CFG_GROUP_COUNT) };
#undef CFG_GROUP_COUNT

typedef enum { CFG_T_INT, CFG_T_REAL, CFG_T_BOOL, CFG_T_STR, CFG_T_STRLIST, CFG_T_REALLIST } cfg_type;

typedef struct {
  const char *name;
  cfg_type type;
  size_t offset; /* within the whole cfg_config */
  const char *def;
  const char *range;
  const char *doc;
} cfg_key;

typedef struct {
  const char *name;
  const char *doc;
  int first, nkeys; /* slice of cfg_keys() */
} cfg_group;

/* Where a key's value came from. */
typedef struct {
  char file[256]; /* deck path, "--set", or "" for the default */
  int line, col;
  int derived;    /* the value was derived from the key set at file:line:col */
} cfg_origin;

typedef struct cfg_config {
#define CFG_MEMBER(gname, GMACRO, gdoc) cfg_##gname gname;
  CFG_GROUPS(CFG_MEMBER)
#undef CFG_MEMBER
  cfg_origin origin[CFG_NKEYS];
  char deck_path[CFG_STR_LEN];
} cfg_config;

const cfg_key *cfg_keys(void);
const cfg_group *cfg_groups(int *ngroups);
/* A hash of the tables and this build's cfg_config layout: equal on ranks that read the same
 * configuration bytes the same way. */
unsigned long long cfg_table_hash(void);
/* Index of group.key in cfg_keys(), or -1. */
int cfg_find(const char *group, const char *key);
/* The largest value the range of number key group.key allows (INFINITY for "[a, inf)"): the bound of
 * what a value read elsewhere (a model's config.json, a product of keys) may take. */
double cfg_key_max(const char *group, const char *key);

/* Fill cfg from defaults, the deck text (deck_len bytes) and the --set overrides
 * ("group.key=value", each setting exactly one key), then check types, ranges and cross-field
 * consistency and derive implied values (n_inner, batch sizes, decay_steps). Returns the number of
 * errors added to errs; cfg is usable only when 0. */
int cfg_load(cfg_config *cfg, const char *deck_text, size_t deck_len, const char *deck_name, char *const *overrides,
             int noverrides, err_list *errs);
/* The same for several namelist files read in order, a later file's keys replacing an earlier's
 * (the deck, then a machine file: greenlm --machine). */
typedef struct {
  const char *text;
  size_t len;
  const char *name;
} cfg_source;
int cfg_load_sources(cfg_config *cfg, const cfg_source *src, int nsrc, char *const *overrides, int noverrides,
                     err_list *errs);

/* Derive the layout keys that depend on the rank count (data_parallel, micro_batches,
 * global_batch_size) and check that the layout fits nranks. Returns the number of errors. */
int cfg_resolve_layout(cfg_config *cfg, int nranks, err_list *errs);

/* Whether the deck's &job task list has this task. */
int cfg_has_task(const cfg_config *cfg, cfg_task task);
/* The task a word of &job task names (a checked deck's words are all tasks), and a task's word. */
cfg_task cfg_task_of(const char *word);
const char *cfg_task_name(cfg_task task);

/* The index of value among the words "a|b|c" (CFG_CHOICES(LIST)), or -1. */
int cfg_choice_index(const char *words, const char *value);
/* The constant of a checked choice key's value: cfg_comm_method_of(&cfg->comm), ... */
#define CFG_CHOICE_OF(g, key, LIST) cfg_##g##_##key cfg_##g##_##key##_of(const cfg_##g *group);
CFG_CHOICE_KEYS(CFG_CHOICE_OF)
#undef CFG_CHOICE_OF
/* Values per quantization bucket: &comm quant_bucket, or the method's default. */
long cfg_comm_bucket(const cfg_comm *c);
/* Whether &comm compresses the exchange: 'topk', or another method than 'none' at fewer than 32 bits. */
int cfg_comm_compressed(const cfg_comm *c);

/* &model as the defaults set it (for models built without a deck: tests, benchmarks). */
void cfg_model_defaults(cfg_model *m);
/* &model's rotary dims per head: head size x rotary_pct rounded down (Hugging Face's rotary_ndims); gpt-neox only. */
long cfg_rotary_dims(const cfg_model *m);
/* Key/value heads: n_kv_head, or n_head when it is 0. */
long cfg_kv_heads(const cfg_model *m);
/* &model activation and head with 'auto' resolved for the architecture: whether the MLP's gelu is the exact erf
 * form (else gelu_new's tanh form), and whether the head is a matrix of its own (else the token embedding's). */
int cfg_model_gelu_erf(const cfg_model *m);
int cfg_model_untied(const cfg_model *m);

/* Whether &eval val is 'none': the eval task scores no dataset. */
int cfg_eval_skips_val(const cfg_config *cfg);
/* The word of &checkpoint restart that means the newest checkpoint in the directory. */
#define CFG_RESTART_LATEST "latest"
/* Whether &checkpoint restart is 'latest' (else a path, or empty: a fresh start). */
int cfg_restart_latest(const cfg_checkpoint *c);

/* Report an error at the place where group.key was set (or "default"). */
void cfg_error_at(const cfg_config *cfg, err_list *errs, const char *group, const char *key, const char *hint,
                  const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* Errors errs->v[from..] about a whole file that the deck key group.key names (errors without a
 * line: cannot open, not a dataset, ...) are moved to the key's place, the file named in the
 * message; errors at a line of the file stay there. */
void cfg_relocate(const cfg_config *cfg, err_list *errs, int from, const char *group, const char *key);

/* Write the resolved deck (a valid deck) with a header comment; defaults are marked. */
void cfg_write_deck(const cfg_config *cfg, FILE *fp, const char *header);
/* Write the Markdown deck reference (doc/deck-reference.md). */
void cfg_write_reference(FILE *fp);

#endif
