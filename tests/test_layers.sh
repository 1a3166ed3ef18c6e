#!/bin/sh
# test_layers: the source folders are layers, and a file includes headers of its own folder and of
# folders below its own only (README.md, "Layout"): no upward or sideways include, so that no
# decision is reached from two directions; and no choice key of the deck is compared as a string
# outside the deck module; and no test check that cannot fail ($? after a command substitution). The
# layers, lowest first:
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
# choices are decided by their enums (deck/cfg.h, CFG_CHOICE_KEYS): no string compare of a choice
# key's value outside the deck module
keys=$(sed -n '/^#define CFG_CHOICE_KEYS/,/^$/p' "$TOP_SRCDIR/src/deck/cfg.h" | grep -o 'X([a-z_]*, [a-z_]*,' | sed 's/.*, \([a-z_]*\),/\1/' | sort -u)
check "no choice keys found in src/deck/cfg.h's CFG_CHOICE_KEYS" [ -n "$keys" ]
pattern=$(printf '%s\n' $keys | paste -sd'|' -)
words=$(sed -n '/---- choices/,/^#define CFG_RANGE_WORD/p' "$TOP_SRCDIR/src/deck/cfg.h" | grep -o 'X(CFG_[A-Z0-9_]*, "[^"]*")' |
  sed 's/.*"\([^"]*\)")/\1/' | sort -u | paste -sd'|' -)
hits=$(grep -nE "(strcmp|strcasecmp|util_strieq)\([^();]*(->|\.)($pattern|task\.v\[[^]]*\]), *\"($words)\"\)" \
  "$TOP_SRCDIR"/src/*.c "$TOP_SRCDIR"/src/*/*.c "$TOP_SRCDIR"/cpu/*.c "$TOP_SRCDIR"/gpu/*.cu 2>/dev/null | grep -v "/src/deck/")
check "a choice key's value compared as a string outside src/deck (use its cfg_GROUP_KEY_of): $hits" [ -z "$hits" ]
# a check whose description runs a command cannot test $? (the substitution resets it): check_status
never=$(grep -nE '^[[:space:]]*check .*\$\(.*\[ "?\$\?"? ' "$TOP_SRCDIR"/tests/*.sh 2>/dev/null)
check "a check that cannot fail (\$? after a command substitution; use check_status \$? ...): $never" [ -z "$never" ]
echo "test_layers: $n files; choice keys: $(printf '%s ' $keys)"
finish
