#!/usr/bin/env python3
"""Write the whole-run fixtures that tests/test_train_reference.sh checks greenlm's training against.

Run on a developer machine from the top of a built checkout (never in CI; the fixtures are committed):

    pip install torch transformers numpy netCDF4
    python3 tests/reference/make_training.py [--greenlm src/greenlm]

It writes, under tests/reference/train/:

  * tok/, train.nc, val.nc: a 512-token BPE vocabulary and the Genesis datasets (greenlm's
    'tokenizer' and 'prepare' tasks on tests/data/kjv-genesis.txt), made once and kept;
  * hf-neo/, hf-gpt2/: the initial weights, tiny Hugging Face models (GPTNeoForCausalLM with a global
    and a local layer; GPT2LMHeadModel) from a fixed torch seed, read by greenlm's &model init_from;
  * for each case CASE.csv (step, loss, grad_norm, val_loss of the reference trainer, run/reference-train,
    fed greenlm's windows), and windows-G.csv, greenlm's window order of G windows a step (250 steps).

The cases (tests/decks/reference-train.nml and the --set lines below): GPT-Neo with 2 and with 4
micro-batches per step, GPT-Neo under bf16 autocast (the reference for greenlm's bf16 storage), and
GPT-2 with 2 micro-batches.
"""
import argparse
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "train")
REL = os.path.relpath(OUT, TOP)

CASES = {  # name: (greenlm --set overrides, reference precision)
    "neo-m2": ([], "fp32"),
    "neo-m4": (["training.global_batch_size=16"], "fp32"),
    "neo-bf16": ([], "bf16"),
    "gpt2-m2": (["model.arch='gpt2'", f"model.init_from='{REL}/hf-gpt2'", "model.attention_types='global'"], "fp32"),
}


def reference_module():
    path = os.path.join(TOP, "run", "reference-train")
    loader = importlib.machinery.SourceFileLoader("reference_train", path)
    spec = importlib.util.spec_from_loader("reference_train", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def datasets(greenlm):
    if os.path.exists(os.path.join(OUT, "val.nc")):
        return
    deck = os.path.join(OUT, "prepare.nml")
    with open(deck, "w") as f:
        f.write(f"""&job task = 'tokenizer', 'prepare', run_dir = '{REL}/prepare', seed = 20240531 /
&tokenizer kind = 'bpe', dir = '{REL}/tok', vocab_size = 512 /
&prepare input = 'tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,
  train_out = '{REL}/train.nc', val_out = '{REL}/val.nc' /
&model vocab_size = 512 /
""")
    subprocess.run([greenlm, deck], cwd=TOP, check=True, stdout=subprocess.DEVNULL)
    os.remove(deck)
    shutil.rmtree(os.path.join(OUT, "prepare"), ignore_errors=True)


def models(ref):
    """The initial weights: run/reference-train's model of the test deck's &model shape, torch seed 29."""
    import torch
    shape = dict(vocab_size=512, block_size=64, n_layer=2, n_embd=32, n_head=4, n_inner=0, window_size=8,
                 layer_norm_epsilon=1e-5, init_std=0.02)
    for name, arch, kinds in (("hf-neo", "gpt-neo", ["global", "local"]), ("hf-gpt2", "gpt2", ["global"])):
        torch.manual_seed(29)
        ref.build_model(dict(shape, arch=arch, attention_types=kinds)).save_pretrained(os.path.join(OUT, name))


def case(greenlm, ref, name, sets, precision):
    run = os.path.join(OUT, "run-" + name)
    deck = os.path.join(OUT, "deck.nml")
    with open(os.path.join(TOP, "tests", "decks", "reference-train.nml")) as f:
        text = f.read().replace("@TOP@", ".").replace("@OUT@", os.path.relpath(run, TOP))
    with open(deck, "w") as f:
        f.write(text)
    cmd = [greenlm, "--set", "job.overwrite=.true."] + sum((["--set", s] for s in sets), []) + [deck]
    subprocess.run(cmd, cwd=TOP, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    cwd = os.getcwd()
    os.chdir(TOP)
    try:
        ref.train(argparse.Namespace(run_dir=run, out=os.path.join(OUT, name + ".csv"), precision=precision, threads=1,
                                     seed=None))
    finally:
        os.chdir(cwd)
    with open(os.path.join(run, "windows.csv")) as f:
        G = sum(1 for line in f if line.startswith("1,"))
    shutil.copy(os.path.join(run, "windows.csv"), os.path.join(OUT, f"windows-{G}.csv"))  # the order of G a step
    shutil.rmtree(run)
    os.remove(deck)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--greenlm", default=os.path.join(TOP, "src", "greenlm"))
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    datasets(a.greenlm)
    ref = reference_module()
    models(ref)
    for name in a.cases:
        case(a.greenlm, ref, name, *CASES[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
