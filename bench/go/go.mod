module roarmq.local/bench/go

go 1.19
