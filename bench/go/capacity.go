// The "capacity" role of the load generator (main.go), for bench/cluster.py.
//
// It reuses overload.go's client (conn, the windowed-confirm publisher, the consumer
// that acks each delivery from its own goroutine, summary, emit) and adds what a
// replicated broker needs and overload_load.go does not do: a vhost other than "/", a
// durable queue declared with arguments (x-queue-type: quorum for RabbitMQ), persistent
// messages (delivery-mode 2) and several targets (port, vhost, queue) in one process, so
// that two vhosts on two nodes are loaded at once by one generator.
//
// Spec:
//
//	{"role": "capacity", "warmup_s": 3, "window_s": 20,
//	 "targets": [{"name": "a", "port": 5672, "vhost": "/", "queue": "cap",
//	              "arguments": {"x-queue-type": "quorum"}, "persistent": true,
//	              "publishers": 4, "confirm_window": 1000, "batch": 100,
//	              "consumers": 2, "prefetch": 1000}]}
//
// Prints {"ready": true} once every connection is set up, {"window_start": true} when
// the measured window opens and {"window_end": true} when it closes (bench/cluster.py
// reads the brokers' CPU times at those two lines), then one JSON result: per target the
// messages sent, confirmed and received in the window, publish -> receive latency, errors;
// and this process's CPU time in the window.
package main

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

type CapTarget struct {
	Name          string            `json:"name"`
	Port          int               `json:"port"`
	Vhost         string            `json:"vhost"`
	Queue         string            `json:"queue"`
	Arguments     map[string]string `json:"arguments"`
	Persistent    bool              `json:"persistent"`
	Publishers    int               `json:"publishers"`
	ConfirmWindow int               `json:"confirm_window"`
	Batch         int               `json:"batch"`
	Consumers     int               `json:"consumers"`
	Prefetch      int               `json:"prefetch"`
}

type CapSpec struct {
	Role    string      `json:"role"`
	WarmupS float64     `json:"warmup_s"`
	WindowS float64     `json:"window_s"`
	Targets []CapTarget `json:"targets"`
}

func durableDeclare(name string, args map[string]string) []byte {
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	table := buf{}
	for _, k := range keys {
		table = table.short(k).u8('S').long(args[k])
	}
	b := buf{}.u16(0).short(name).u8(bits(false, true, false, false, false)).u32(uint32(len(table)))
	return methodFrame(1, 50, 10, append(b, table...))
}

// persistentPrefix: basic.publish + content header (delivery-mode 2, or no properties) +
// the body frame's head for a 16-byte body; the publisher appends body and frame end.
func persistentPrefix(queue string, persistent bool) []byte {
	out := buf(methodFrame(1, 60, 40, buf{}.u16(0).short("").short(queue).u8(0)))
	if persistent {
		out = out.u8(2).u16(1).u32(15).u16(60).u16(0).u64(16).u16(0x1000).u8(2).u8(frameEnd)
	} else {
		out = out.u8(2).u16(1).u32(14).u16(60).u16(0).u64(16).u16(0).u8(frameEnd)
	}
	return out.u8(3).u16(1).u32(16)
}

type capLoad struct {
	t          CapTarget
	publishers []*publisher
	consumers  []*consumer
}

func runCapacity(s CapSpec) (map[string]any, error) {
	var recording int32
	loads := []*capLoad{}
	for _, t := range s.Targets {
		if t.Batch <= 0 {
			t.Batch = 100
		}
		admin, err := dial(t.Port, t.Vhost, setupTimeout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		if _, err := admin.callWithin(setupTimeout, durableDeclare(t.Queue, t.Arguments), 50, 11); err != nil {
			return nil, fmt.Errorf("%s: queue.declare %s: %w", t.Name, t.Queue, err)
		}
		admin.nc.Close()
		l := &capLoad{t: t}
		for i := 0; i < t.Consumers; i++ {
			c, err := dial(t.Port, t.Vhost, setupTimeout)
			if err != nil {
				return nil, fmt.Errorf("%s consumer: %w", t.Name, err)
			}
			defer c.nc.Close()
			k := &consumer{spec: ConsSpec{Group: t.Name, Queue: t.Queue, Prefetch: t.Prefetch},
				c: c, recording: &recording, done: make(chan struct{})}
			k.ackCond = sync.NewCond(&k.ackMu)
			if t.Prefetch > 0 {
				qos := methodFrame(1, 60, 10, buf{}.u32(0).u16(uint16(t.Prefetch)).u8(0))
				if _, err := c.callWithin(setupTimeout, qos, 60, 11); err != nil {
					return nil, err
				}
			}
			consume := methodFrame(1, 60, 20,
				buf{}.u16(0).short(t.Queue).short("bench"+strconv.Itoa(i)).u8(0).u32(0))
			if _, err := c.callWithin(setupTimeout, consume, 60, 21); err != nil {
				return nil, fmt.Errorf("%s basic.consume: %w", t.Name, err)
			}
			l.consumers = append(l.consumers, k)
		}
		for i := 0; i < t.Publishers; i++ {
			c, err := dial(t.Port, t.Vhost, setupTimeout)
			if err != nil {
				return nil, fmt.Errorf("%s publisher: %w", t.Name, err)
			}
			defer c.nc.Close()
			p := &publisher{spec: PubSpec{Group: t.Name, Queue: t.Queue,
				ConfirmWindow: t.ConfirmWindow, Batch: t.Batch}, c: c, acked: []bool{true}}
			p.cond = sync.NewCond(&p.mu)
			if t.ConfirmWindow > 0 {
				if _, err := c.callWithin(setupTimeout, methodFrame(1, 85, 10, buf{}.u8(0)), 85, 11); err != nil {
					return nil, fmt.Errorf("%s confirm.select: %w", t.Name, err)
				}
			}
			p.prefix = persistentPrefix(t.Queue, t.Persistent)
			l.publishers = append(l.publishers, p)
		}
		loads = append(loads, l)
	}
	emit(map[string]any{"ready": true})

	t0 := time.Now()
	winStart := t0.Add(time.Duration(s.WarmupS * float64(time.Second)))
	end := winStart.Add(time.Duration(s.WindowS * float64(time.Second)))
	var wg sync.WaitGroup
	for _, l := range loads {
		for _, k := range l.consumers {
			wg.Add(1)
			go func(k *consumer) { defer wg.Done(); k.read() }(k)
			go k.writeAcks()
		}
		for _, p := range l.publishers {
			wg.Add(1)
			go func(p *publisher) { defer wg.Done(); p.write(end) }(p)
			go p.read()
		}
	}
	type counts struct{ sent, confirmed, received int64 }
	snapshot := func() []counts {
		out := []counts{}
		for _, l := range loads {
			var c counts
			for _, p := range l.publishers {
				c.sent += atomic.LoadInt64(&p.sent)
				c.confirmed += p.confirmedCount()
			}
			for _, k := range l.consumers {
				c.received += atomic.LoadInt64(&k.received)
			}
			out = append(out, c)
		}
		return out
	}
	time.Sleep(time.Until(winStart))
	before := snapshot()
	cpu0, w0 := cpuSeconds(), time.Now()
	atomic.StoreInt32(&recording, 1)
	emit(map[string]any{"window_start": true})
	time.Sleep(time.Until(end))
	after := snapshot()
	cpu1, window := cpuSeconds(), time.Since(w0).Seconds()
	atomic.StoreInt32(&recording, 0)
	emit(map[string]any{"window_end": true})

	for _, l := range loads {
		for _, p := range l.publishers {
			p.stop()
		}
		for _, k := range l.consumers {
			k.stop()
		}
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
	}
	targets := []map[string]any{}
	for i, l := range loads {
		lat := []int64{}
		errs := []any{}
		blocked := 0
		for _, k := range l.consumers {
			lat = append(lat, k.latencies...)
			if k.err != nil {
				errs = append(errs, k.err.Error())
			}
		}
		for _, p := range l.publishers {
			p.mu.Lock()
			if p.err != nil {
				errs = append(errs, p.err.Error())
			}
			blocked += p.blocked
			p.mu.Unlock()
		}
		row := summary(lat)
		row["name"], row["vhost"], row["queue"], row["port"] = l.t.Name, l.t.Vhost, l.t.Queue, l.t.Port
		row["sent"] = after[i].sent - before[i].sent
		row["confirmed"] = after[i].confirmed - before[i].confirmed
		row["received"] = after[i].received - before[i].received
		row["blocked"], row["errors"] = blocked, errs
		targets = append(targets, row)
	}
	return map[string]any{
		"window_s": window, "cpu_s": cpu1 - cpu0, "cpu_pct": 100 * (cpu1 - cpu0) / window,
		"targets": targets,
	}, nil
}
