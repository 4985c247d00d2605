# tpot_vs_seq_len.gp - time per output token against the sequence length
# (prompt tokens before decoding), one line per (KV policy, batch size).
# Variables (make_all.sh): data (x = prompt tokens, y = ms, sd), n, titles.
load dir."/common.gp"
set xlabel "sequence length before decoding (prompt tokens)"
set ylabel "time per output token (ms per decode step)"
set logscale x 2
set format x "%g"
set offsets graph 0.05, graph 0.05, graph 0.05, 0
set yrange [0:*]
set key top left
plot for [i=0:n-1] data index i using 1:2:3 with yerrorlines ls (i+1) title word(titles, i+1)
