# paper_fig12.gp - the Q-Infer paper's Figure 12 layout: throughput against
# batch size, one panel per model (rows) and input length (columns), one
# line per system. Variables (make_all.sh): data (blocks of x = batch,
# y = tok/s, one per panel x system, panel-major; a system not run has one
# NaN row), models, prompts (words), systems (words: key titles), heading,
# subline, ylabel_text.
load dir."/common.gp"
unset title
nm = words(models); np = words(prompts); ns = words(systems)
set multiplot layout nm, np title sprintf("%s\n{/*0.75 %s}", heading, subline)
set logscale x 2
set logscale y
set format y "%g"
set xtics (1, 4, 16, 64)
set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05
set key top left font ",8" samplen 1.5
do for [r=1:nm] {
  do for [c=1:np] {
    set title sprintf("%s, input %s", word(models, r), word(prompts, c)) font ",10"
    if (r == nm) { set xlabel "batch" } else { unset xlabel }
    if (c == 1) { set ylabel ylabel_text } else { unset ylabel }
    if (r == 1 && c == 1) { set key } else { unset key }
    p = (r - 1) * np + (c - 1)
    plot for [i=0:ns-1] data index (p * ns + i) using 1:2 with linespoints ls (i+1) title word(systems, i+1)
  }
}
unset multiplot
