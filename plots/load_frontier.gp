# load_frontier.gp - the serving frontier measured over HTTP by qinfer load:
# output-token throughput against p99 time per output token as the arrival
# rate rises, one line per sweep, each point labelled with its rate and the
# rates where the SLO broke drawn open; the sweep's TPOT bound dashed.
# Variables (make_all.sh): data (x = tok/s, y = p99 TPOT ms, rate, 1 when
# the SLO held), n, titles, bound_ms.
load dir."/common.gp"
set xlabel "output-token throughput at the client (tokens/s)"
set ylabel "p99 time per output token at the client (ms)"
set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05
set yrange [0:*]
set xrange [0:*]
set key bottom right
plot for [i=0:n-1] data index i using 1:2 with lines ls (i+1) notitle, \
     for [i=0:n-1] data index i using 1:($4 > 0 ? $2 : NaN) with points ls (i+1) title word(titles, i+1), \
     for [i=0:n-1] data index i using 1:($4 > 0 ? NaN : $2) with points ls (i+1) pt 6 ps 1.6 notitle, \
     for [i=0:n-1] data index i using 1:2:(sprintf("%g/s", $3)) with labels offset 0.8,0.6 font ",9" notitle, \
     bound_ms with lines dt 2 lc rgb "#888888" title sprintf("TPOT bound (%g ms); open: SLO broken", bound_ms)
