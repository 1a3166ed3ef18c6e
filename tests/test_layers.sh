#!/bin/sh
# test_layers: the source folders are layers, and a file includes headers of its own folder and of
# folders below its own only (README.md, "Layout"): no upward or sideways include, so that no
# decision is reached from two directions. The layers, lowest first:
#   base            utilities, errors, the environment, NetCDF helpers, the quantizer's arithmetic
#   deck            namelist parsing and the typed configuration
#   text energy     tokenizers, corpora and datasets; energy meters and run files
#   model           the model and the backend interface its ops go through
#   cpu gpu parallel  the CPU and CUDA backends; the layout, collectives, the gradient exchange,
#                   the backend choice per rank
#   io              checkpoints, Hugging Face files
#   eval plan       scoring and benchmarks; the planner
#   src (top)       the tasks and programs
. "$(dirname "$0")/lib.sh"
# allowed DIR LAYER INC: whether a file of folder DIR (layer LAYER) may include a header of INC
allowed() { [ "$3" = "$1" ] || [ "$(level "$3")" -lt "$2" ]; }
level() {
  case $1 in
    base) echo 0 ;; deck) echo 1 ;; text | energy) echo 2 ;; model) echo 3 ;; cpu | gpu | parallel) echo 4 ;;
    io) echo 5 ;; eval | plan) echo 6 ;; top) echo 7 ;; *) echo "" ;;
  esac
}
n=0
for f in "$TOP_SRCDIR"/src/*.[ch] "$TOP_SRCDIR"/src/*/*.[ch] "$TOP_SRCDIR"/cpu/*.[ch] "$TOP_SRCDIR"/gpu/*.[ch] \
  "$TOP_SRCDIR"/gpu/*.cu; do
  [ -f "$f" ] || continue
  rel=${f#"$TOP_SRCDIR"/}
  case $rel in src/*/*) dir=${rel#src/}; dir=${dir%%/*} ;; src/*) dir=top ;; *) dir=${rel%%/*} ;; esac
  mine=$(level "$dir")
  check "$rel: folder '$dir' has no layer in tests/test_layers.sh" [ -n "$mine" ]
  n=$((n + 1))
  for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z]*\)\/[^"]*".*/\1/p' "$f" | sort -u); do
    theirs=$(level "$inc")
    check "$rel includes a header of '$inc', which has no layer" [ -n "$theirs" ]
    [ -n "$theirs" ] && [ -n "$mine" ] || continue
    check "$rel (layer '$dir') includes $(grep -o "#include \"$inc/[^\"]*\"" "$f" | head -n 1 | cut -d' ' -f2): a layer above or beside its own" \
      allowed "$dir" "$mine" "$inc"
  done
done
echo "test_layers: $n files"
finish
