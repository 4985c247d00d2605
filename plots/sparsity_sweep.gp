# sparsity_sweep.gp - one measure against the target activation sparsity,
# one line per (model, mode), error bars one sample sd.
# Variables (make_all.sh): data (x = sparsity %, y, sd), n, titles, ylab, fity (1: the y axis
# fits the data rather than starting at 0; linear either way).
load dir."/common.gp"
set xlabel "target activation sparsity (% of the thresholded activations zeroed)"
set ylabel ylab
if (!fity) { set yrange [0:*] }
set offsets graph 0.04, graph 0.04, graph 0.08, graph 0.08
set key top left
plot for [i=0:n-1] data index i using 1:2:3 with yerrorlines ls (i+1) title word(titles, i+1)
