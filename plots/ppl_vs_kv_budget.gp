# ppl_vs_kv_budget.gp - perplexity against the KV budget, one line per
# policy, the full cache as a dashed horizontal reference.
# Variables (make_all.sh): data (x = budget %, y = ppl, y error), n series,
# titles (quoted words), full_ppl (NaN when absent), full_title.
load dir."/common.gp"
set xlabel "KV budget (% of each sequence's length kept per layer and KV head)"
set ylabel "perplexity (lower is better)"
set logscale y
set format y "%g"
set ytics (1, 2, 3, 5, 7, 10, 15, 20, 25, 30, 35, 40, 45, 50, 60, 70, 80, 100, 120, 150, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 5000, 7000, 10000)
set xtics 0, 25, 100
set autoscale fix
set offsets graph 0.06, graph 0.06, graph 0.08, graph 0.08
set key top right
plot for [i=0:n-1] data index i using 1:2 with linespoints ls (i+1) title word(titles, i+1), \
     full_ppl with lines dt 2 lw 2 lc rgb "black" title full_title
