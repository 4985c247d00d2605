# latency_throughput.gp - the serving frontier: output-token throughput
# against p99 time per output token as the arrival rate rises, one line per
# KV policy, each point labelled with its rate; the TPOT bound dashed.
# Variables (make_all.sh): data (x = tok/s, y = p99 TPOT ms, rate), n, titles, bound_ms.
load dir."/common.gp"
set xlabel "output-token throughput (tokens/s)"
set ylabel "p99 time per output token (ms)"
set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05
set yrange [0:*]
set xrange [0:*]
set key top left
plot for [i=0:n-1] data index i using 1:2 with linespoints ls (i+1) title word(titles, i+1), \
     for [i=0:n-1] data index i using 1:2:(sprintf("%g/s", $3)) with labels offset 0.8,0.6 font ",9" notitle, \
     bound_ms with lines dt 2 lc rgb "#888888" title sprintf("TPOT bound (%g ms)", bound_ms)
