# throughput_vs_batch.gp - aggregate decode throughput against the batch
# size, one line per (KV policy, prompt length), error bars one sample sd.
# Variables (make_all.sh): data (x = batch, y = tok/s, sd), n, titles.
load dir."/common.gp"
set xlabel "batch size (sequences decoded together)"
set ylabel "decode throughput, all sequences (tokens/s)"
set logscale x 2
set format x "%g"
set offsets graph 0.05, graph 0.05, graph 0.05, 0
set yrange [0:*]
set key top left
plot for [i=0:n-1] data index i using 1:2:3 with yerrorlines ls (i+1) title word(titles, i+1)
