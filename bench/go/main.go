// The load generator of bench/: a minimal AMQP 0-9-1 client on Go's standard library,
// one process per role, its spec one JSON argument (its "role" chooses):
//
//	go build -o roarmq-load .     (in bench/go; the benchmarks build it themselves)
//	roarmq-load '{"role": "load", ...}'
//
// Roles: load, probe, bad-get-recover, bad-nack, bad-bind (overload.go), capacity
// (capacity.go). Results are JSON lines on stdout (emit).
package main

import (
	"encoding/json"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: roarmq-load '<spec as JSON>'")
		os.Exit(2)
	}
	var role struct {
		Role string `json:"role"`
	}
	if err := json.Unmarshal([]byte(os.Args[1]), &role); err != nil {
		fmt.Fprintln(os.Stderr, "bad spec:", err)
		os.Exit(2)
	}
	var result map[string]any
	var err error
	if role.Role == "capacity" {
		var s CapSpec
		if err = json.Unmarshal([]byte(os.Args[1]), &s); err == nil {
			result, err = runCapacity(s)
		}
	} else {
		var s Spec
		if err = json.Unmarshal([]byte(os.Args[1]), &s); err == nil {
			result, err = runOverloadRole(s)
		}
	}
	if err != nil {
		emit(map[string]any{"error": err.Error()})
		os.Exit(1)
	}
	if result != nil {
		emit(result)
	}
}

func runOverloadRole(s Spec) (map[string]any, error) {
	switch s.Role {
	case "load":
		return runLoad(s)
	case "probe":
		return nil, runProbe(s)
	case "bad-get-recover":
		return runBadGetRecover(s)
	case "bad-nack":
		return runBadNack(s)
	case "bad-bind":
		return runBadBind(s)
	}
	return nil, fmt.Errorf("unknown role %q", s.Role)
}
