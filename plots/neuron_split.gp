# neuron_split.gp - decode throughput against the GPU's memory, one line per
# (way of filling it, batch): the FFN's hot neurons, or whole layers.
# Variables (make_all.sh): data (x = GPU GiB, y = tok/s, sd), n, titles.
load dir."/common.gp"
set xlabel "GPU memory in use, peak (GiB)"
set ylabel "decode throughput, all sequences (tokens/s)"
set logscale y
set yrange [1:*]
set format y "%g"
set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05
set key top left
plot for [i=0:n-1] data index i using 1:2:3 with yerrorlines ls (i+1) title word(titles, i+1)
