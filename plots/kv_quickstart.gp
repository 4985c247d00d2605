# kv_quickstart.gp - the quickstart's comparison of KV policies: perplexity
# (left) and decode throughput at batch 1 and 4 (right), one bar group per
# policy. Variables (make_all.sh): data (policy, ppl, ppl err, b1 tok/s,
# b1 sd, b4 tok/s, b4 sd), ppl_title, b1_title, b4_title.
load dir."/common.gp"
unset title
set multiplot layout 1, 2 title sprintf("%s\n{/*0.75 %s}", heading, subline)
set style data histograms
set style histogram errorbars gap 1.5 lw 1.5
set style fill solid 0.75 border lc rgb "#404040"
set boxwidth 0.85
set yrange [0:*]
set xtics nomirror
set grid noxtics ytics
set key top left
set xlabel "KV policy"
set ylabel "perplexity (lower is better)"
plot data using 2:3:xtic(1) lc rgb "#1f77b4" title ppl_title
set ylabel "decode throughput (tokens/s)"
set key top right
set yrange [0:*]
set offsets 0, 0, graph 0.15, 0
plot data using 4:5:xtic(1) lc rgb "#2ca02c" title b1_title, \
     '' using 6:7 lc rgb "#ff7f0e" title b4_title
unset multiplot
