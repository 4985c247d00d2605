# common.gp - the look every figure shares; loaded first by each figure
# script. make_all.sh sets the terminal and output, then these variables:
#   data      the data file (blocks separated by two blank lines, one per series)
#   heading   the figure's title;  subline  what was measured, on which hardware
set encoding utf8
set title sprintf("%s\n{/*0.75 %s}", heading, subline)
set grid lc rgb "#d0d0d0" lw 1
set border lc rgb "#404040"
set key noenhanced opaque box lc rgb "#a0a0a0" samplen 2.5 spacing 1.15
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 1.1
set style line 2 lc rgb "#d62728" lw 2 pt 5 ps 1.1
set style line 3 lc rgb "#2ca02c" lw 2 pt 9 ps 1.3
set style line 4 lc rgb "#9467bd" lw 2 pt 11 ps 1.3
set style line 5 lc rgb "#ff7f0e" lw 2 pt 13 ps 1.3
set style line 6 lc rgb "#8c564b" lw 2 pt 4 ps 1.1
set style line 7 lc rgb "#e377c2" lw 2 pt 6 ps 1.1
set style line 8 lc rgb "#7f7f7f" lw 2 pt 8 ps 1.1
