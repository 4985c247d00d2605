# needle_heatmap.gp - passkey retrieval accuracy over (prompt length, depth
# of the key), one cell per pair, the percentage written in it.
# Variables (make_all.sh): data (column index, row index, accuracy 0..1),
# xtics_def and ytics_def (gnuplot tic lists), nx, ny.
load dir."/common.gp"
unset grid
unset key
set xlabel "prompt length (tokens)"
set ylabel "depth of the key (% of the prompt)"
set xtics @xtics_def
set ytics @ytics_def
set xrange [-0.5:nx-0.5]
set yrange [-0.5:ny-0.5]
set cblabel "retrieval accuracy (%)"
set cbrange [0:100]
set palette defined (0 "#b2182b", 50 "#f7f7f7", 100 "#2166ac")
set tics out nomirror
set size ratio 0.62
# boxes rather than `with image`, which needs at least two cells each way
plot data using 1:2:(0.5):(0.5):($3*100) with boxxyerror fc palette fs solid 1.0 border lc rgb "white" notitle, \
     data using 1:2:(sprintf("%.0f%%", $3*100)) with labels font ",12" notitle
