#!/usr/bin/env bash
# make_all.sh - every figure from the results databases, as PNG and SVG in
# plots/out/ (plots/README.md says what each shows and from which metrics).
#
#   bash plots/make_all.sh [--db-dir DIR] [--out DIR] [--quiet]
#
#   --db-dir DIR   where the databases are (default results/, one file per
#                  experiment: kv_quickstart.db, kv_budget_sweep.db, ...)
#   --out DIR      where the figures go (default plots/out/)
#
# A figure whose database or metric is absent is skipped with a message;
# anything else that goes wrong (a database that cannot be read, gnuplot
# failing) is an error, and the script exits 1 after trying the others.
# Data are read with the sqlite3 shell (read-only, so a sweep may be writing
# meanwhile) into data files for the gnuplot scripts beside this one; each
# figure is labelled with the CPU (and GPU) its runs were measured on, and
# simulated values are marked as such. Needs gnuplot (with the pngcairo
# terminal, as gnuplot-nox has) and sqlite3.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
db_dir=results
out=$here/out
quiet=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --db-dir) [[ $# -ge 2 ]] || { echo "make_all.sh: --db-dir needs a folder" >&2; exit 2; }; db_dir=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || { echo "make_all.sh: --out needs a folder" >&2; exit 2; }; out=$2; shift 2 ;;
    --quiet) quiet=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make_all.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in gnuplot sqlite3; do
  command -v "$tool" >/dev/null ||
    { echo "make_all.sh: $tool not found (apt-get install gnuplot-nox sqlite3, or bash scripts/setup.sh)" >&2; exit 1; }
done
gnuplot -e 'set terminal pngcairo' 2>/dev/null ||
  { echo "make_all.sh: this gnuplot has no pngcairo terminal (install gnuplot-nox)" >&2; exit 1; }
[[ -d $db_dir ]] || { echo "make_all.sh: $db_dir is not a folder (see --db-dir)" >&2; exit 1; }
mkdir -p "$out" || { echo "make_all.sh: cannot create $out" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

made=0 skipped=0 failed=0
say()  { ((quiet)) || echo "make_all.sh: $*" >&2; }
skip() { echo "make_all.sh: skipped $1: $2" >&2; skipped=$((skipped + 1)); }
fail() { echo "make_all.sh: error in $1: $2" >&2; failed=$((failed + 1)); }

# q DB SQL: rows, fields separated by tabs; a failure leaves a message in $work/sql.err
q() { sqlite3 -batch -readonly -noheader -separator $'\t' "$1" "$2" 2>"$work/sql.err"; }

# The runs of experiment $2 in database $1 that are done: a WHERE clause on r.
done_runs() { echo "r.status = 'done' AND r.experiment_id = (SELECT id FROM experiments WHERE name = '$2')"; }

# A metric as qinfer results shows it: its name, then its params as
# [key=value,...] (decode.tokens_per_s[batch=4]), as SQL over metrics m.
label="(m.name || coalesce('[' || (SELECT group_concat(key || '=' || value, ',') FROM json_each(m.params)) || ']', ''))"

# has DB EXP METRIC: the experiment's finished runs have the metric
has() {
  local n
  n=$(q "$1" "SELECT count(*) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $(done_runs "$1" "$2")
              AND $label = '$3'") || return 2
  [[ $n -gt 0 ]]
}

# check FIG DB EXP SCRIPT METRIC...: 0 when the figure can be made;
# otherwise the skip or error is reported and it returns 1
check() {
  local fig=$1 db=$2 exp=$3 script=$4; shift 4
  if [[ ! -f $db ]]; then skip "$fig" "no $db (run qinfer run experiments/$script, or see --db-dir)"; return 1; fi
  local m rc ver
  ver=$(q "$db" "PRAGMA user_version") || { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return 1; }
  if ((ver < 3)); then
    skip "$fig" "$db was written by an older qinfer (schema $ver): qinfer run experiments/$script migrates it (and skips what is done)"
    return 1
  fi
  for m in "$@"; do
    has "$db" "$exp" "$m"; rc=$?
    if ((rc == 2)); then fail "$fig" "$db: $(head -1 "$work/sql.err")"; return 1; fi
    if ((rc == 1)); then skip "$fig" "$db has no metric $m in experiment $exp"; return 1; fi
  done
  return 0
}

# hardware DB EXP: "Intel Xeon ... (2 cores)", every machine the runs were on
hardware() {
  q "$1" "SELECT group_concat(h, '; ') FROM (SELECT DISTINCT coalesce(r.cpu, 'unknown CPU')
            || CASE WHEN r.cores > 0 THEN ' (' || r.cores || ' cores)' ELSE '' END
            || CASE WHEN r.gpu IS NOT NULL THEN ', ' || r.gpu ELSE '' END AS h
          FROM runs r WHERE $(done_runs "$1" "$2"))"
}

# model DB EXP: the models' file names
models() {
  q "$1" "SELECT group_concat(mp, ', ') FROM (SELECT DISTINCT replace(coalesce(json_extract(r.config_json, '\$.model'),
            r.model_path, 'model unknown'), rtrim(coalesce(r.model_path, ''), replace(coalesce(r.model_path, ''), '/', '')), '') AS mp
          FROM runs r WHERE $(done_runs "$1" "$2"))"
}

# simulated DB EXP METRIC...: prints 1 when any value of these metrics is simulated
simulated() {
  local list
  list=$(printf "'%s'," "${@:3}")
  q "$1" "SELECT coalesce(max(m.simulated), 0) FROM runs r JOIN metrics m ON m.run_id = r.id
          WHERE $(done_runs "$1" "$2") AND $label IN (${list%,})"
}

# render FIG GP VAR=VALUE...: the figure as out/FIG.png and out/FIG.svg
render() {
  local fig=$1 gp=$2; shift 2
  local vars="dir='$here'" v
  for v in "$@"; do vars+="; $v"; done
  local term
  for term in png svg; do
    local setterm
    if [[ $term == png ]]; then setterm="set terminal pngcairo size 1200,760 font 'DejaVu Sans,12' enhanced"
    else setterm="set terminal svg size 1200,760 dynamic font 'DejaVu Sans,12' enhanced"; fi
    if ! gnuplot -e "$setterm; set output '$out/$fig.$term'; $vars" "$here/$gp" 2>"$work/gp.err"; then
      fail "$fig" "gnuplot: $(grep -v '^$' "$work/gp.err" | head -3 | tr '\n' ' ')"
      rm -f "$out/$fig.png" "$out/$fig.svg"
      return 1
    fi
    if grep -q "warning" "$work/gp.err"; then say "$fig: gnuplot: $(grep warning "$work/gp.err" | head -2 | tr '\n' ' ')"; fi
  done
  say "made $out/$fig.png and .svg"
  made=$((made + 1))
}

# gp_str S: S as a gnuplot string literal (for key titles: plain text)
gp_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

# gp_title S: the same for the figure's title, which uses enhanced text: its
# special characters escaped so they print as themselves
gp_title() {
  local s=$1 c
  for c in _ ^ '{' '}' @ '&' '~'; do s=${s//"$c"/\\$c}; done
  gp_str "$s"
}

# A JSON path of the configuration, as SQL.
cfg() { echo "json_extract(r.config_json, '\$.$1')"; }

# ---- kv_quickstart: perplexity and decode throughput per policy -----------------------
fig_quickstart() {
  local fig=kv_quickstart db=$db_dir/kv_quickstart.db exp=kv_quickstart
  check "$fig" "$db" "$exp" quickstart.lua ppl.value "decode.tokens_per_s[batch=1]" "decode.tokens_per_s[batch=4]" || return
  local where
  where=$(done_runs "$db" "$exp")
  # one row per policy (in the order the sweep ran them), mean and sd per metric
  if ! q "$db" "
      WITH v AS (SELECT $(cfg kv_policy) AS policy, $label AS name, m.value, r.id FROM runs r JOIN metrics m ON m.run_id = r.id
                 WHERE $where),
           s AS (SELECT policy, name, avg(value) AS mean, count(*) AS n,
                        sqrt(max(sum(value * value) - sum(value) * sum(value) / count(*), 0) / max(count(*) - 1, 1)) AS sd
                 FROM v GROUP BY policy, name)
      SELECT p.policy,
        (SELECT mean FROM s WHERE s.policy = p.policy AND name = 'ppl.value'),
        coalesce((SELECT mean FROM s WHERE s.policy = p.policy AND name = 'ppl.err'), 0),
        (SELECT mean FROM s WHERE s.policy = p.policy AND name = 'decode.tokens_per_s[batch=1]'),
        (SELECT sd FROM s WHERE s.policy = p.policy AND name = 'decode.tokens_per_s[batch=1]'),
        (SELECT mean FROM s WHERE s.policy = p.policy AND name = 'decode.tokens_per_s[batch=4]'),
        (SELECT sd FROM s WHERE s.policy = p.policy AND name = 'decode.tokens_per_s[batch=4]')
      FROM (SELECT policy, min(id) AS first FROM v GROUP BY policy) p ORDER BY p.first" >"$work/$fig.dat"; then
    fail "$fig" "$db: $(head -1 "$work/sql.err")"; return
  fi
  # a policy lacking a metric gets an empty field: gnuplot reads it as missing
  sed -i 's/\t\t/\tNaN\t/g; s/\t\t/\tNaN\t/g; s/\t$/\tNaN/' "$work/$fig.dat"
  local budgets hw sim mark=""
  budgets=$(q "$db" "SELECT group_concat(b, ', ') FROM (SELECT DISTINCT CAST(round($(cfg kv_budget) * 100) AS INT) || '%' AS b
                     FROM runs r WHERE $where AND $(cfg kv_budget) IS NOT NULL)")
  hw=$(hardware "$db" "$exp")
  sim=$(simulated "$db" "$exp" ppl.value "decode.tokens_per_s[batch=1]" "decode.tokens_per_s[batch=4]")
  [[ $sim == 1 ]] && mark=" (simulated)"
  render "$fig" kv_quickstart.gp "data='$work/$fig.dat'" \
    "heading=$(gp_title "KV cache policies at a budget of ${budgets:-?}: accuracy and decode speed$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"), devil corpus; ${hw}; means, error bars: ppl standard error, throughput sample sd")" \
    "ppl_title=$(gp_str "perplexity$mark")" "b1_title=$(gp_str "batch 1$mark")" \
    "b4_title=$(gp_str "batch 4, all sequences$mark")"
}

# series_data DB EXP METRIC SERIES_SQL X_SQL WHERE_EXTRA SCALE -> $work/series.dat and $work/series.titles
# One block per distinct SERIES_SQL value (text), in the order the sweep ran
# them: x, the mean and sample sd of METRIC (times SCALE, default 1) over
# the runs and repetitions.
series_data() {
  local db=$1 exp=$2 metric=$3 series=$4 x=$5 extra=${6:-1} scale=${7:-1}
  : >"$work/series.dat"
  : >"$work/series.titles"
  local rows
  rows=$(q "$db" "SELECT $series AS s, max(m.simulated) FROM runs r JOIN metrics m ON m.run_id = r.id
                  WHERE $(done_runs "$db" "$exp") AND m.name = '$metric' AND ($extra)
                  GROUP BY s ORDER BY min(r.id)") || return 1
  local i=0 s sim
  while IFS=$'\t' read -r s sim; do
    [[ -n $s ]] || continue
    local sq=${s//\'/\'\'}
    ((i > 0)) && printf '\n\n' >>"$work/series.dat"
    q "$db" "SELECT $x AS x, avg(m.value) * $scale,
               coalesce(sqrt(max(sum(m.value * m.value) - sum(m.value) * sum(m.value) / count(*), 0) / (count(*) - 1)), 0) * $scale
             FROM runs r JOIN metrics m ON m.run_id = r.id
             WHERE $(done_runs "$db" "$exp") AND m.name = '$metric' AND ($extra) AND $series = '$sq'
             GROUP BY x ORDER BY x" | tr '\t' ' ' >>"$work/series.dat" || return 1
    [[ $sim == 1 ]] && s+=" (simulated)"
    printf '"%s" ' "${s//\"/\'}" >>"$work/series.titles"
    i=$((i + 1))
  done <<<"$rows"
  echo "$i" >"$work/series.n"
}

# ---- throughput_batch_seq: throughput against batch, time per token against length ---------
fig_throughput() {
  local fig=throughput_vs_batch db=$db_dir/throughput_batch_seq.db exp=throughput_batch_seq
  check "$fig" "$db" "$exp" throughput_batch_seq.lua decode.tokens_per_s || return
  local series="$(cfg kv_policy) || CASE WHEN $(cfg kv_policy) <> 'full' AND $(cfg kv_budget) IS NOT NULL
                THEN ' ' || CAST(round($(cfg kv_budget) * 100) AS INT) || '%' ELSE '' END || ', prompt ' || $(cfg prompt)"
  series_data "$db" "$exp" decode.tokens_per_s "$series" "$(cfg batch)" ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  local sim mark="" ngen
  sim=$(simulated "$db" "$exp" decode.tokens_per_s)
  [[ $sim == 1 ]] && mark=" (simulated)"
  ngen=$(q "$db" "SELECT group_concat(DISTINCT $(cfg n_gen)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  render "$fig" throughput_vs_batch.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" \
    "heading=$(gp_title "Decode throughput against batch size$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"), greedy decoding of ${ngen:-?} tokens per sequence; $(hardware "$db" "$exp"); mean and sample sd over repetitions")"
}

fig_tpot() {
  local fig=tpot_vs_seq_len db=$db_dir/throughput_batch_seq.db exp=throughput_batch_seq
  check "$fig" "$db" "$exp" throughput_batch_seq.lua decode.tpot_s || return
  # the smallest and the largest batch: the two ends of the trade-off
  local bmin bmax
  bmin=$(q "$db" "SELECT min($(cfg batch)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  bmax=$(q "$db" "SELECT max($(cfg batch)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  local series="$(cfg kv_policy) || CASE WHEN $(cfg kv_policy) <> 'full' AND $(cfg kv_budget) IS NOT NULL
                THEN ' ' || CAST(round($(cfg kv_budget) * 100) AS INT) || '%' ELSE '' END || ', batch ' || $(cfg batch)"
  series_data "$db" "$exp" decode.tpot_s "$series" "$(cfg prompt)" "$(cfg batch) IN (${bmin:-1}, ${bmax:-1})" 1000 ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  local sim mark=""
  sim=$(simulated "$db" "$exp" decode.tpot_s)
  [[ $sim == 1 ]] && mark=" (simulated)"
  render "$fig" tpot_vs_seq_len.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" \
    "heading=$(gp_title "Time per output token against sequence length$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"); $(hardware "$db" "$exp"); mean and sample sd over repetitions")"
}

# ---- kv_budget_sweep: perplexity against the KV budget ----------------------------------------
fig_ppl_budget() {
  local fig=ppl_vs_kv_budget db=$db_dir/kv_budget_sweep.db exp=kv_budget_sweep
  check "$fig" "$db" "$exp" kv_budget_sweep.lua ppl.value || return
  # One (ctx, chunks) setting per figure: the longest context measured.
  local setting ctx chunks
  setting=$(q "$db" "SELECT $(cfg ctx), $(cfg chunks) FROM runs r WHERE $(done_runs "$db" "$exp")
                     GROUP BY 1, 2 ORDER BY $(cfg ctx) * $(cfg chunks) DESC, count(*) DESC LIMIT 1") ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  IFS=$'\t' read -r ctx chunks <<<"$setting"
  local extra="1"
  [[ -n $ctx ]] && extra="$(cfg ctx) = $ctx AND $(cfg chunks) = $chunks"
  series_data "$db" "$exp" ppl.value "$(cfg kv_policy)" "round($(cfg kv_budget) * 100, 3)" \
    "$extra AND $(cfg kv_policy) <> 'full'" || { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  local full fsim ftitle="full cache (control)"
  IFS=$'\t' read -r full fsim < <(q "$db" "SELECT avg(m.value), max(m.simulated) FROM runs r JOIN metrics m ON m.run_id = r.id
      WHERE $(done_runs "$db" "$exp") AND m.name = 'ppl.value' AND $extra AND $(cfg kv_policy) = 'full'")
  [[ -n $full ]] || { full=NaN; ftitle="full cache (not measured)"; }
  [[ ${fsim:-0} == 1 ]] && ftitle+=" (simulated)"
  if [[ $(cat "$work/series.n") -eq 0 && $full == NaN ]]; then skip "$fig" "no ppl.value at ctx $ctx"; return; fi
  local sim mark=""
  sim=$(simulated "$db" "$exp" ppl.value)
  [[ $sim == 1 ]] && mark=" (simulated)"
  render "$fig" ppl_vs_kv_budget.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" "full_ppl=$full" "full_title=$(gp_str "$ftitle")" \
    "heading=$(gp_title "Perplexity against KV budget, per policy$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"), devil corpus, decode mode, ${chunks:-?} chunk$([[ $chunks == 1 ]] || echo s) of ${ctx:-?} tokens; $(hardware "$db" "$exp")")"
}

# ---- sparsity_sweep: perplexity and decode rate against the target sparsity --------------------
fig_sparsity() {
  local db=$db_dir/sparsity_sweep.db exp=sparsity_sweep metric fig ylab fity
  local heading
  for metric in ppl.value decode.tokens_per_s decode.sparse_over_dense; do
    case $metric in
      ppl.value) fig=ppl_vs_sparsity ylab="perplexity (lower is better)" fity=1 heading=Perplexity ;;
      decode.tokens_per_s) fig=decode_vs_sparsity ylab="batch-1 decode rate (tokens/s)" fity=0 heading="Decode rate" ;;
      *) fig=sparse_over_dense_vs_sparsity ylab="sparse / dense step time (paired steps; below 1 is faster)" fity=1
         heading="Sparse over dense decode step time" ;;
    esac
    check "$fig" "$db" "$exp" sparsity_sweep.lua "$metric" || continue
    # a text other than devil names the series (runs before the corpus parameter scored devil)
    series_data "$db" "$exp" "$metric" "$(cfg model) || ' ' || CASE coalesce($(cfg corpus), 'devil') WHEN 'devil' THEN ''
                 ELSE replace($(cfg corpus), rtrim($(cfg corpus), replace($(cfg corpus), '/', '')), '') || ' ' END || $(cfg mode)" \
      "round($(cfg sparsity) * 100, 3)" ||
      { fail "$fig" "$db: $(head -1 "$work/sql.err")"; continue; }
    local sim mark=""
    sim=$(simulated "$db" "$exp" "$metric")
    [[ $sim == 1 ]] && mark=" (simulated)"
    render "$fig" sparsity_sweep.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
      "titles=$(gp_str "$(cat "$work/series.titles")")" "ylab=$(gp_str "$ylab")" "fity=$fity" \
      "heading=$(gp_title "$heading against activation sparsity (teal, cats)$mark")" \
      "subline=$(gp_title "$(models "$db" "$exp"), devil corpus unless named; $(hardware "$db" "$exp"); mean and sample sd over repetitions")"
  done
}

# ---- needle: retrieval accuracy over (length, depth) -------------------------------------------
fig_needle() {
  local db=$db_dir/needle.db exp=needle
  check needle_accuracy "$db" "$exp" needle.lua needle.accuracy || return
  local where
  where="$(done_runs "$db" "$exp") AND m.name = 'needle.accuracy'"
  # one heatmap per KV policy setting (a single one when the runs have none)
  local pol="coalesce($(cfg kv_policy) || CASE WHEN $(cfg kv_policy) <> 'full' AND $(cfg kv_budget) IS NOT NULL
             THEN '_' || CAST(round($(cfg kv_budget) * 100) AS INT) ELSE '' END, '')"
  local settings s
  settings=$(q "$db" "SELECT DISTINCT $pol FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where") ||
    { fail needle_accuracy "$db: $(head -1 "$work/sql.err")"; return; }
  while IFS= read -r s; do
    local fig=needle_accuracy${s:+_$s} sq=${s//\'/\'\'}
    local lens deps
    lens=$(q "$db" "SELECT DISTINCT $(cfg length) FROM runs r JOIN metrics m ON m.run_id = r.id
                    WHERE $where AND $pol = '$sq' ORDER BY 1")
    deps=$(q "$db" "SELECT DISTINCT $(cfg depth) FROM runs r JOIN metrics m ON m.run_id = r.id
                    WHERE $where AND $pol = '$sq' ORDER BY 1")
    if [[ -z $lens || -z $deps ]]; then skip "$fig" "the runs have no length and depth parameters"; continue; fi
    local xt="" yt="" i=0 v nx ny
    while read -r v; do xt+="${xt:+, }\"$v\" $i"; i=$((i + 1)); done <<<"$lens"; nx=$i; i=0
    while read -r v; do yt+="${yt:+, }\"$(awk -v d="$v" 'BEGIN { printf "%g", d * 100 }')\" $i"; i=$((i + 1)); done <<<"$deps"; ny=$i
    # cell indices: the rank of the length and depth among the distinct values
    q "$db" "WITH c AS (SELECT $(cfg length) AS len, $(cfg depth) AS dep, avg(m.value) AS acc
                        FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where AND $pol = '$sq' GROUP BY 1, 2)
             SELECT (SELECT count(DISTINCT c2.len) FROM c c2 WHERE c2.len < c.len),
                    (SELECT count(DISTINCT c2.dep) FROM c c2 WHERE c2.dep < c.dep), acc FROM c ORDER BY 2, 1" |
      tr '\t' ' ' >"$work/$fig.dat" || { fail "$fig" "$db: $(head -1 "$work/sql.err")"; continue; }
    local sim mark="" label=${s:-all runs}
    sim=$(q "$db" "SELECT max(m.simulated) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where AND $pol = '$sq'")
    [[ $sim == 1 ]] && mark=" (simulated)"
    label=${label//_/ at }
    [[ $label == *" at "* ]] && label+="%"
    render "$fig" needle_heatmap.gp "data='$work/$fig.dat'" "xtics_def='($xt)'" "ytics_def='($yt)'" "nx=$nx" "ny=$ny" \
      "heading=$(gp_title "Passkey retrieval accuracy, KV policy ${label}$mark")" \
      "subline=$(gp_title "$(models "$db" "$exp"); $(hardware "$db" "$exp"); share of trials whose answer holds the key")"
  done <<<"$settings"
}

# ---- latency_throughput: the serving frontier per KV policy -------------------------------------
fig_frontier() {
  local fig=latency_throughput db=$db_dir/latency_throughput.db exp=latency_throughput
  check "$fig" "$db" "$exp" latency_throughput.lua "throughput.output_tokens_per_s[max_batch=16]" \
    "tpot.p99_s[max_batch=16]" || return
  local where pol
  where="$(done_runs "$db" "$exp") AND $(cfg rate) > 0"
  pol="$(cfg kv_policy) || CASE WHEN $(cfg kv_policy) <> 'full' AND $(cfg kv_budget) IS NOT NULL
       THEN ' ' || CAST(round($(cfg kv_budget) * 100) AS INT) || '%' ELSE '' END"
  : >"$work/$fig.dat"
  : >"$work/$fig.titles"
  local i=0 s
  while IFS= read -r s; do
    [[ -n $s ]] || continue
    ((i > 0)) && printf '\n\n' >>"$work/$fig.dat"
    q "$db" "SELECT avg(CASE WHEN $label = 'throughput.output_tokens_per_s[max_batch=16]' THEN m.value END),
                    avg(CASE WHEN $label = 'tpot.p99_s[max_batch=16]' THEN m.value END) * 1000, $(cfg rate)
             FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where AND ($pol) = '${s//\'/\'\'}'
             GROUP BY $(cfg rate) ORDER BY $(cfg rate)" | tr '\t' ' ' >>"$work/$fig.dat" ||
      { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
    printf '"%s" ' "$s" >>"$work/$fig.titles"
    i=$((i + 1))
  done < <(q "$db" "SELECT DISTINCT $pol FROM runs r WHERE $where ORDER BY r.id")
  local sim mark=""
  sim=$(simulated "$db" "$exp" "tpot.p99_s[max_batch=16]")
  [[ $sim == 1 ]] && mark=" (simulated)"
  render "$fig" latency_throughput.gp "data='$work/$fig.dat'" "n=$i" "bound_ms=250" \
    "titles=$(gp_str "$(cat "$work/$fig.titles")")" \
    "heading=$(gp_title "Serving frontier: throughput against p99 time per output token$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"); Poisson arrivals (rate per point), continuous batching up to 16; $(hardware "$db" "$exp")")"
}

# ---- load_frontier: the frontier qinfer load measured over HTTP, per sweep ----------------------
fig_load_frontier() {
  local fig=load_frontier db=$db_dir/load_test.db exp=load_test
  if [[ ! -f $db ]]; then skip "$fig" "no $db (run qinfer load -m MODEL, see paper-repro/README.md)"; return; fi
  local n
  n=$(q "$db" "SELECT count(*) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $(done_runs "$db" "$exp")
               AND m.name IN ('throughput.output_tokens_per_s', 'tpot.p99_s')") ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  ((n > 0)) || { skip "$fig" "$db has no load runs with throughput.output_tokens_per_s and tpot.p99_s"; return; }
  # the last four sweeps, each a line
  local sweep="$(cfg sweep)" where="$(done_runs "$db" "$exp")"
  : >"$work/$fig.dat"
  : >"$work/$fig.titles"
  local i=0 s title
  while IFS=$'\t' read -r s title; do
    [[ -n $s ]] || continue
    ((i > 0)) && printf '\n\n' >>"$work/$fig.dat"
    q "$db" "SELECT max(CASE WHEN m.name = 'throughput.output_tokens_per_s' THEN m.value END),
                    max(CASE WHEN m.name = 'tpot.p99_s' THEN m.value END) * 1000, $(cfg rate),
                    coalesce(max(CASE WHEN m.name = 'goodput.fraction' THEN m.value END), 0) >= $(cfg slo_goodput)
             FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where AND $sweep = '${s//\'/\'\'}'
               AND m.params = json_object('rate', $(cfg rate))
             GROUP BY r.id HAVING max(CASE WHEN m.name = 'tpot.p99_s' THEN 1 END) = 1
             ORDER BY $(cfg rate)" | tr '\t' ' ' >>"$work/$fig.dat" ||
      { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
    printf '"%s" ' "$title" >>"$work/$fig.titles"
    i=$((i + 1))
  done < <(q "$db" "SELECT $sweep, 'serve ' || coalesce(nullif($(cfg serve_args), ''), '(defaults)') || ', ' || $sweep FROM runs r
                    WHERE $where GROUP BY $sweep ORDER BY max(r.id) DESC LIMIT 4")
  local bound
  bound=$(q "$db" "SELECT $(cfg slo_tpot_ms) FROM runs r WHERE $where ORDER BY r.id DESC LIMIT 1")
  render "$fig" load_frontier.gp "data='$work/$fig.dat'" "n=$i" "bound_ms=${bound:-0}" \
    "titles=$(gp_str "$(cat "$work/$fig.titles")")" \
    "heading=$(gp_title "Serving frontier over HTTP (qinfer load against qinfer serve)")" \
    "subline=$(gp_title "$(models "$db" "$exp"); Poisson arrivals (rate per point), streamed, timed at the client; $(hardware "$db" "$exp")")"
}

# ---- placement_ablation: placement policies on a simulated machine --------------------
fig_placement() {
  local fig=placement_ablation db=$db_dir/placement_ablation.db exp=placement_ablation
  check "$fig" "$db" "$exp" placement_ablation.lua decode.tokens_per_s || return
  local series="$(cfg placement) || ', prompt ' || $(cfg prompt)"
  series_data "$db" "$exp" decode.tokens_per_s "$series" "$(cfg batch)" ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  local sim mark="" machine kv ngen word="measured on"
  sim=$(simulated "$db" "$exp" decode.tokens_per_s)
  [[ $sim == 1 ]] && mark=" (simulated)" && word="SIMULATED machine"
  # the machine the figures are of: the profile and the GPU memory cap, not the host that simulated it
  machine=$(q "$db" "SELECT group_concat(DISTINCT $(cfg profile) || ', GPU memory ' || $(cfg gpu_mem)) FROM runs r
                     WHERE $(done_runs "$db" "$exp")")
  kv=$(q "$db" "SELECT group_concat(DISTINCT $(cfg kv_policy)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  ngen=$(q "$db" "SELECT group_concat(DISTINCT $(cfg n_gen)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  render "$fig" throughput_vs_batch.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" \
    "heading=$(gp_title "Placement policies: decode throughput against batch size$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"); $word ${machine:-?}; KV ${kv:-?}; ${ngen:-?} steps per sequence")"
}

# ---- neuron_split: hot neurons against whole layers on a simulated GPU ------------------
fig_neuron_split() {
  local fig=neuron_split db=$db_dir/neuron_split.db exp=neuron_split
  check "$fig" "$db" "$exp" neuron_split.lua decode.tokens_per_s || return
  local series="CASE $(cfg mode) WHEN 'split' THEN 'hot FFN neurons' ELSE 'whole layers (ngl)' END || ', batch ' || $(cfg batch)"
  local x="(SELECT round(g.value / 1073741824.0, 2) FROM metrics g WHERE g.run_id = r.id AND g.name = 'gpu.peak_bytes')"
  # the CPU dense (runs without the density parameter are dense too)
  series_data "$db" "$exp" decode.tokens_per_s "$series" "$x" "coalesce($(cfg density), 1) = 1" ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  local sim mark="" word="measured on" machine
  sim=$(simulated "$db" "$exp" decode.tokens_per_s)
  [[ $sim == 1 ]] && mark=" (simulated)" && word="SIMULATED machine"
  machine=$(q "$db" "SELECT group_concat(DISTINCT $(cfg profile)) FROM runs r WHERE $(done_runs "$db" "$exp")")
  render "$fig" neuron_split.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" \
    "heading=$(gp_title "Hot FFN neurons or whole layers on the GPU: decode throughput against GPU memory$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"); $word ${machine:-?}; the CPU side dense")"
  # the CPU's FFN sparse (a what-if of the simulator), batch 1
  fig=neuron_split_sparse
  local n_sparse
  n_sparse=$(q "$db" "SELECT count(*) FROM runs r WHERE $(done_runs "$db" "$exp") AND $(cfg density) < 1")
  if [[ ${n_sparse:-0} == 0 ]]; then
    skip "$fig" "no runs with density < 1 in $db (rerun experiments/neuron_split.lua)"
    return
  fi
  series="CASE $(cfg mode) WHEN 'split' THEN 'hot FFN neurons' ELSE 'whole layers (ngl)' END || ', density ' || $(cfg density)"
  series_data "$db" "$exp" decode.tokens_per_s "$series" "$x" "$(cfg batch) = 1" ||
    { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
  render "$fig" neuron_split.gp "data='$work/series.dat'" "n=$(cat "$work/series.n")" \
    "titles=$(gp_str "$(cat "$work/series.titles")")" \
    "heading=$(gp_title "The CPU's FFN sparse: hot neurons or whole layers on the GPU, batch 1$mark")" \
    "subline=$(gp_title "$(models "$db" "$exp"); $word ${machine:-?}; density: the CPU's active share (what-if)")"
}

# ---- paper_fig12: the paper's Figure 12 on the simulated machine ---------------------
# Throughput against batch, a panel per model and input length, a line per
# system, for one weight type and profile (the first in the database, or
# FIG12_WEIGHTS / FIG12_PROFILE).
fig_paper_fig12() {
  local fig=paper_fig12 db=$db_dir/paper_fig12.db exp=paper_fig12 metric=${FIG12_METRIC:-decode.tokens_per_s}
  check "$fig" "$db" "$exp" paper_fig12.lua $metric || return
  local where weights profile
  where=$(done_runs "$db" "$exp")
  weights=${FIG12_WEIGHTS:-$(q "$db" "SELECT $(cfg weights) FROM runs r WHERE $where ORDER BY r.id LIMIT 1")}
  profile=${FIG12_PROFILE:-$(q "$db" "SELECT $(cfg profile) FROM runs r WHERE $where ORDER BY r.id LIMIT 1")}
  where="$where AND $(cfg weights) = '$weights' AND $(cfg profile) = '$profile'"
  local models prompts systems="" s mo pr
  models=$(q "$db" "SELECT $(cfg model) FROM runs r WHERE $where GROUP BY 1 ORDER BY min(r.id)" | tr '\n' ' ')
  prompts=$(q "$db" "SELECT $(cfg prompt) FROM runs r WHERE $where GROUP BY 1 ORDER BY 1" | tr '\n' ' ')
  for s in llamacpp flexgen powerinfer qinfer; do
    [[ -n $(q "$db" "SELECT 1 FROM runs r WHERE $where AND $(cfg system) = '$s' LIMIT 1") ]] && systems+="$s "
  done
  : >"$work/$fig.dat"
  local first=1
  for mo in $models; do
    for pr in $prompts; do
      for s in $systems; do
        ((first)) || printf '\n\n' >>"$work/$fig.dat"
        first=0
        q "$db" "SELECT $(cfg batch), m.value FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where
                 AND m.name = '$metric' AND $(cfg model) = '$mo' AND $(cfg prompt) = $pr AND $(cfg system) = '$s'
                 ORDER BY $(cfg batch)" >"$work/block" || { fail "$fig" "$db: $(head -1 "$work/sql.err")"; return; }
        if [[ -s $work/block ]]; then cat "$work/block" >>"$work/$fig.dat"; else printf '1\tNaN\n' >>"$work/$fig.dat"; fi
      done
    done
  done
  local sim mark="" word="measured on" err
  sim=$(simulated "$db" "$exp" $metric)
  [[ $sim == 1 ]] && mark=" (SIMULATED)" && word="SIMULATED machine"
  err=$(q "$db" "SELECT round(max(m.value) * 100, 1) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE $where
                 AND m.name = 'sim.validated_error.prompt'")
  render "$fig" paper_fig12.gp "data='$work/$fig.dat'" "models=$(gp_str "$models")" "prompts=$(gp_str "$prompts")" \
    "systems=$(gp_str "$systems")" "ylabel_text=$(gp_str "$([[ $metric == e2e.* ]] && echo "tokens/s, prefill included" || echo "decode tokens/s")")" \
    "heading=$(gp_title "Throughput against batch: llama.cpp, FlexGen, PowerInfer, Q-Infer$mark")" \
    "subline=$(gp_title "$word $profile, $weights weights; GPU calibration's validated error ${err:-?}% (median, prompt); host CPU not validated; a missing line: not run")"
}

fig_quickstart
fig_placement
fig_neuron_split
fig_paper_fig12
fig_frontier
fig_load_frontier
fig_throughput
fig_tpot
fig_ppl_budget
fig_sparsity
fig_needle
echo "make_all.sh: $made figure(s) made in $out, $skipped skipped, $failed failed" >&2
((failed == 0))
