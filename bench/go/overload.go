// The overload roles of the load generator (main.go), for bench/overload.py and
// bench/topic_go.py. One process runs one role, chosen by the spec's "role":
//
//	load             publishers and consumers, one connection (channel 1) each, on named
//	                 queues reached through the default exchange. Prints {"ready": true}
//	                 once every connection is set up, then runs warmup_s + window_s and
//	                 prints one JSON result: per publisher and consumer, and per group,
//	                 the messages sent / received in the window, publish -> receive
//	                 latency (p50/p99/max), and this process's CPU time in the window.
//	probe            a separate connection doing a passive queue.declare of its own
//	                 (exclusive) queue every interval_ms, recording each round trip;
//	                 optionally a new TCP connection every connect_every_ms, timing
//	                 header -> connection.start. Prints {"ready": true}; a "start" line
//	                 on stdin resets the figures; at stdin EOF it prints its result.
//	bad-get-recover  publishes one body_bytes message, then on a second connection
//	                 writes basic.get + basic.recover(requeue) pairs (request_bytes of
//	                 frames) and never reads that socket for hold_s.
//	bad-nack         publishes n messages, takes them all with basic.get (no-ack off),
//	                 then basic.nack(requeue) each in ascending delivery-tag order,
//	                 timing the nacks (up to a passive queue.declare behind them).
//	                 Topic mode (topic_bindings or topic_literals > 0): the first queue is
//	                 bound to topic exchange `exchange` with generated patterns (see
//	                 topicTopology), and publishers whose "exchange" is set publish to
//	                 it, cycling through topic_keys distinct routing keys.
//	bad-bind         fills a topic exchange's routing-key cache with `keys` distinct
//	                 keys of `words` words, then sends `binds` binds of patterns
//	                 "#.zzN.#" in one write, timing the gaps between their bind-oks.
//
// Messages have 16-byte bodies: the send time (ns since this process started, so
// publisher and consumer share a clock by living in one process) and a sequence
// number. A publisher encodes method + content header + body-frame head once and
// writes `batch` messages per write; with confirm_window it keeps at most that many
// unconfirmed. A consumer acks each delivery with its own basic.ack (multiple=false),
// written by a separate goroutine so reading never waits on writing; with
// ack_delay_us a worker acks one message at a time after that delay.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const frameEnd = 0xCE

var start = time.Now()

func nowNS() int64 { return int64(time.Since(start)) }

// -- encoding ---------------------------------------------------------------------

type buf []byte

func (b buf) u8(v uint8) buf   { return append(b, v) }
func (b buf) u16(v uint16) buf { return binary.BigEndian.AppendUint16(b, v) }
func (b buf) u32(v uint32) buf { return binary.BigEndian.AppendUint32(b, v) }
func (b buf) u64(v uint64) buf { return binary.BigEndian.AppendUint64(b, v) }
func (b buf) short(s string) buf {
	return append(append(b, byte(len(s))), s...)
}
func (b buf) long(s string) buf { return append(b.u32(uint32(len(s))), s...) }

func bits(flags ...bool) uint8 {
	var v uint8
	for i, f := range flags {
		if f {
			v |= 1 << i
		}
	}
	return v
}

func methodFrame(channel, class, method uint16, args buf) []byte {
	f := make(buf, 0, 12+len(args)).u8(1).u16(channel).u32(uint32(4 + len(args)))
	f = append(f.u16(class).u16(method), args...)
	return f.u8(frameEnd)
}

// message: basic.publish + content header (no properties) + body frames.
func message(exchange, key string, body []byte, frameMax int) []byte {
	return publishFrames(exchange, key, body, frameMax, false)
}

// publishFrames: message, or with persistent the one property delivery-mode 2.
func publishFrames(exchange, key string, body []byte, frameMax int, persistent bool) []byte {
	out := buf(methodFrame(1, 60, 40, buf{}.u16(0).short(exchange).short(key).u8(0)))
	if persistent { // property flags: delivery-mode (bit 12), then its octet
		out = out.u8(2).u16(1).u32(15).u16(60).u16(0).u64(uint64(len(body))).u16(0x1000).u8(2).u8(frameEnd)
	} else {
		out = out.u8(2).u16(1).u32(14).u16(60).u16(0).u64(uint64(len(body))).u16(0).u8(frameEnd)
	}
	for off := 0; off < len(body); off += frameMax - 8 {
		chunk := body[off:min(len(body), off+frameMax-8)]
		out = append(out.u8(3).u16(1).u32(uint32(len(chunk))), chunk...).u8(frameEnd)
	}
	return out
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func queueDeclare(name string, passive, exclusive, autoDelete bool) []byte {
	return methodFrame(1, 50, 10,
		buf{}.u16(0).short(name).u8(bits(passive, false, exclusive, autoDelete, false)).u32(0))
}

func ackFrame(tag uint64) []byte {
	return methodFrame(1, 60, 80, buf{}.u64(tag).u8(0))
}

// -- connection -------------------------------------------------------------------

type conn struct {
	nc       net.Conn
	r        *bufio.Reader
	frameMax int
	hdr      [7]byte
	payload  []byte
}

type closedError struct{ what string }

func (e closedError) Error() string { return e.what }

// read one frame; the payload is valid until the next read.
func (c *conn) read() (byte, []byte, error) {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return 0, nil, err
	}
	size := int(binary.BigEndian.Uint32(c.hdr[3:]))
	if size+1 > cap(c.payload) {
		c.payload = make([]byte, size+1)
	}
	p := c.payload[:size+1]
	if _, err := io.ReadFull(c.r, p); err != nil {
		return 0, nil, err
	}
	if p[size] != frameEnd {
		return 0, nil, errors.New("bad frame end")
	}
	return c.hdr[0], p[:size], nil
}

// closeReason: the text of a connection.close / channel.close, or "" for other methods.
func (c *conn) closeReason(p []byte) string {
	class, method := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	if !(class == 10 && method == 50) && !(class == 20 && method == 40) {
		return ""
	}
	if class == 10 {
		c.nc.Write(methodFrame(0, 10, 51, nil))
	}
	code := binary.BigEndian.Uint16(p[4:])
	text := string(p[7 : 7+int(p[6])])
	return fmt.Sprintf("%s.close: %d %s", map[uint16]string{10: "connection", 20: "channel"}[class], code, text)
}

// wait for method class.method, skipping anything else; its arguments (valid until the next read).
func (c *conn) wait(class, method uint16) ([]byte, error) {
	for {
		typ, p, err := c.read()
		if err != nil {
			return nil, err
		}
		if typ != 1 {
			continue
		}
		if binary.BigEndian.Uint16(p) == class && binary.BigEndian.Uint16(p[2:]) == method {
			return p[4:], nil
		}
		if reason := c.closeReason(p); reason != "" {
			return nil, closedError{reason}
		}
	}
}

func (c *conn) call(frame []byte, class, method uint16) ([]byte, error) {
	if _, err := c.nc.Write(frame); err != nil {
		return nil, err
	}
	return c.wait(class, method)
}

// callWithin: call with a deadline on the whole round trip.
func (c *conn) callWithin(d time.Duration, frame []byte, class, method uint16) ([]byte, error) {
	c.nc.SetDeadline(time.Now().Add(d))
	defer c.nc.SetDeadline(time.Time{})
	return c.call(frame, class, method)
}

// messageCount by a passive queue.declare.
func (c *conn) messageCount(queue string, d time.Duration) (int64, error) {
	ok, err := c.callWithin(d, queueDeclare(queue, true, false, false), 50, 11)
	if err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint32(ok[1+int(ok[0]):])), nil
}

// publishConfirmed: confirm.select, write the n messages msg(i), wait until all are confirmed.
func (c *conn) publishConfirmed(n int, msg func(i int) []byte, d time.Duration) error {
	if _, err := c.callWithin(d, methodFrame(1, 85, 10, buf{}.u8(0)), 85, 11); err != nil {
		return err
	}
	c.nc.SetDeadline(time.Now().Add(d))
	defer c.nc.SetDeadline(time.Time{})
	werr := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(c.nc, 256*1024)
		for i := 0; i < n; i++ {
			if _, err := w.Write(msg(i)); err != nil {
				werr <- err
				return
			}
		}
		werr <- w.Flush()
	}()
	acked := make([]bool, n+1)
	confirmed, floor, nacked := 0, 0, 0
	for confirmed < n {
		typ, p, err := c.read()
		if err != nil {
			return err
		}
		if typ != 1 {
			continue
		}
		class, method := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
		if class == 60 && (method == 80 || method == 120) {
			tag, multiple := int(binary.BigEndian.Uint64(p[4:])), p[12]&1 != 0
			lo := tag
			if multiple {
				lo = floor + 1
			}
			for t := lo; t <= tag && t <= n; t++ {
				if !acked[t] {
					acked[t] = true
					confirmed++
					if method == 120 {
						nacked++
					}
				}
			}
			for floor < n && acked[floor+1] {
				floor++
			}
		} else if reason := c.closeReason(p); reason != "" {
			return closedError{reason}
		}
	}
	if err := <-werr; err != nil {
		return err
	}
	if nacked > 0 {
		return fmt.Errorf("%d of %d messages nacked", nacked, n)
	}
	return nil
}

// -- statistics -------------------------------------------------------------------

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// latencies (ns, any order): count, p50, p99, max in ms; NaN when empty (JSON null).
func summary(ns []int64) map[string]any {
	out := map[string]any{"count": len(ns), "p50_ms": nil, "p99_ms": nil, "p999_ms": nil, "max_ms": nil}
	if len(ns) == 0 {
		return out
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	rank := func(q float64) float64 {
		i := int(math.Ceil(q/100*float64(len(ns)))) - 1
		if i < 0 {
			i = 0
		}
		return float64(ns[i]) / 1e6
	}
	out["p50_ms"], out["p99_ms"], out["p999_ms"] = rank(50), rank(99), rank(99.9)
	out["max_ms"] = float64(ns[len(ns)-1]) / 1e6
	return out
}

func emit(v any) {
	b, _ := json.Marshal(v)
	os.Stdout.Write(append(b, '\n'))
}

func errText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// -- spec ---------------------------------------------------------------------------

type PubSpec struct {
	Group         string  `json:"group"`
	Queue         string  `json:"queue"`
	Rate          float64 `json:"rate"` // messages/s; 0 = as fast as it can
	ConfirmWindow int     `json:"confirm_window"`
	Persistent    bool    `json:"persistent"` // delivery-mode 2
	Batch         int     `json:"batch"`
	Exchange      string  `json:"exchange"` // publish here: topic mode cycles the keys, exchange mode uses Queue as the key
}

type ConsSpec struct {
	Group      string `json:"group"`
	Queue      string `json:"queue"`
	Prefetch   int    `json:"prefetch"`
	NoAck      bool   `json:"no_ack"`
	AckDelayUS int    `json:"ack_delay_us"`
}

type Spec struct {
	Role     string  `json:"role"`
	Port     int     `json:"port"`
	WarmupS  float64 `json:"warmup_s"`
	WindowS  float64 `json:"window_s"`
	TimeoutS float64 `json:"timeout_s"`
	Cleanup  bool    `json:"cleanup"`
	// load
	Queues     []string   `json:"queues"`
	Durable    bool       `json:"durable"` // the queues declared durable
	Publishers []PubSpec  `json:"publishers"`
	Consumers  []ConsSpec `json:"consumers"`
	// probe
	IntervalMS     float64 `json:"interval_ms"`
	ConnectEveryMS float64 `json:"connect_every_ms"`
	// bad cases
	Queue        string `json:"queue"`
	Queue2       string `json:"queue2"`
	Exchange     string `json:"exchange"`
	BodyBytes    int    `json:"body_bytes"`
	RequestBytes int    `json:"request_bytes"`
	N            int    `json:"n"`
	Keys         int    `json:"keys"`
	Words        int    `json:"words"`
	Binds        int    `json:"binds"`
	// load, exchange mode: an exchange of this type (fanout, direct) named Exchange, every
	// queue of Queues bound to it with its own name as the key
	ExchangeType string `json:"exchange_type"`
	// load, topic mode
	TopicBindings int    `json:"topic_bindings"`
	TopicLiterals int    `json:"topic_literals"`
	TopicKeys     int    `json:"topic_keys"`
	TopicShape    string `json:"topic_shape"`
	TopicQueues   int    `json:"topic_queues"` // > 0: bindings spread over this many queues
}

const setupTimeout = 60 * time.Second

// -- load: publishers -------------------------------------------------------------

type publisher struct {
	spec     PubSpec
	c        *conn
	prefix   []byte   // basic.publish + header + body-frame head
	prefixes [][]byte // topic mode: one prefix per routing key, cycled

	sent int64 // atomic

	mu        sync.Mutex
	cond      *sync.Cond
	acked     []bool // by delivery tag; len-1 = tags issued
	floor     int
	confirmed int64
	stopped   bool
	blocked   int
	err       error
}

func newPublisher(port int, s PubSpec, keys []string) (*publisher, error) {
	c, err := dial(port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	p := &publisher{spec: s, c: c, acked: []bool{true}}
	p.cond = sync.NewCond(&p.mu)
	if p.spec.Batch <= 0 {
		p.spec.Batch = 100
	}
	if s.ConfirmWindow > 0 {
		if _, err := c.callWithin(setupTimeout, methodFrame(1, 85, 10, buf{}.u8(0)), 85, 11); err != nil {
			return nil, err
		}
	}
	full := publishFrames("", s.Queue, make([]byte, 16), c.frameMax, s.Persistent)
	p.prefix = full[:len(full)-17]
	if s.Exchange != "" && len(keys) == 0 { // exchange mode: one key, the queue's name
		full := publishFrames(s.Exchange, s.Queue, make([]byte, 16), c.frameMax, s.Persistent)
		p.prefix = full[:len(full)-17]
	}
	if s.Exchange != "" {
		for _, key := range keys {
			full := publishFrames(s.Exchange, key, make([]byte, 16), c.frameMax, s.Persistent)
			p.prefixes = append(p.prefixes, full[:len(full)-17])
		}
	}
	return p, nil
}

func (p *publisher) fail(err error) {
	p.mu.Lock()
	if p.err == nil && !p.stopped {
		p.err = err
	}
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *publisher) stop() {
	p.mu.Lock()
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.c.nc.SetDeadline(time.Now())
}

func (p *publisher) confirmedCount() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.confirmed
}

const prSetTimerslack = 29 // prctl(2): this thread's timer slack, in ns

// preciseSleep: a paced publisher's wait between messages, a nanosleep(2) of the calling
// thread (locked to it, its timer slack 1 ns). Go 1.19's time.Sleep waits in the runtime's
// epoll_wait, whose timeout is whole milliseconds: in an otherwise idle generator a
// 100-us sleep lasted about half a millisecond, so "10,000 msg/s" sent 1,800 against any
// broker, and more the more deliveries woke the poller (a rate that depended on the broker
// measured). The blocked thread leaves its P to the readers (runLoad gives paced loads a
// second P).
func preciseSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}

func (p *publisher) write(end time.Time) {
	b := make([]byte, 0, p.spec.Batch*(len(p.prefix)+17))
	var interval time.Duration
	if p.spec.Rate > 0 {
		interval = time.Duration(float64(time.Second) / p.spec.Rate)
		runtime.LockOSThread() // the pacer sleeps in its own thread: see preciseSleep
		defer runtime.UnlockOSThread()
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerslack, 1, 0)
	}
	next := time.Now()
	var seq uint64
	var k int // topic mode: the next key
	p.c.nc.SetWriteDeadline(end)
	for {
		n := p.spec.Batch
		if interval > 0 { // fixed rate: one message every interval, no catching up in bursts
			n = 1
			if d := time.Until(next); d > 0 {
				preciseSleep(d)
			}
			next = next.Add(interval)
			if now := time.Now(); now.Sub(next) > interval {
				next = now
			}
		}
		if time.Now().After(end) {
			return
		}
		p.mu.Lock()
		if w := p.spec.ConfirmWindow; w > 0 {
			for !p.stopped && int64(len(p.acked)-1)-p.confirmed >= int64(w) {
				p.cond.Wait()
			}
			n = min(n, w-int(int64(len(p.acked)-1)-p.confirmed))
			for i := 0; i < n; i++ {
				p.acked = append(p.acked, false)
			}
		}
		stopped := p.stopped
		p.mu.Unlock()
		if stopped {
			return
		}
		b = b[:0]
		for i := 0; i < n; i++ {
			if p.prefixes != nil {
				b = append(b, p.prefixes[k]...)
				if k++; k == len(p.prefixes) {
					k = 0
				}
			} else {
				b = append(b, p.prefix...)
			}
			b = binary.BigEndian.AppendUint64(b, uint64(nowNS()))
			b = binary.BigEndian.AppendUint64(b, seq)
			b = append(b, frameEnd)
			seq++
		}
		if _, err := p.c.nc.Write(b); err != nil {
			if !isTimeout(err) {
				p.fail(err)
			}
			return
		}
		atomic.AddInt64(&p.sent, int64(n))
	}
}

func (p *publisher) read() {
	for {
		typ, f, err := p.c.read()
		if err != nil {
			if !isTimeout(err) {
				p.fail(err)
			}
			return
		}
		if typ != 1 {
			continue
		}
		class, method := binary.BigEndian.Uint16(f), binary.BigEndian.Uint16(f[2:])
		switch {
		case class == 60 && (method == 80 || method == 120): // basic.ack / basic.nack
			p.confirm(int(binary.BigEndian.Uint64(f[4:])), f[12]&1 != 0)
		case class == 10 && method == 60: // connection.blocked
			p.mu.Lock()
			p.blocked++
			p.mu.Unlock()
		default:
			if reason := p.c.closeReason(f); reason != "" {
				p.fail(closedError{reason})
				return
			}
		}
	}
}

func (p *publisher) confirm(tag int, multiple bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lo := tag
	if multiple {
		lo = p.floor + 1
	}
	for t := lo; t <= tag && t < len(p.acked); t++ {
		if !p.acked[t] {
			p.acked[t] = true
			p.confirmed++
		}
	}
	for p.floor+1 < len(p.acked) && p.acked[p.floor+1] {
		p.floor++
	}
	p.cond.Broadcast()
}

// -- load: consumers --------------------------------------------------------------

type consumer struct {
	spec ConsSpec
	c    *conn

	received  int64 // atomic
	recording *int32
	latencies []int64 // reader goroutine only
	err       error

	ackMu     sync.Mutex
	ackCond   *sync.Cond
	acks      []byte
	ackClosed bool
	work      chan uint64
	done      chan struct{}
}

func newConsumer(port int, s ConsSpec, recording *int32, queues []string) (*consumer, error) {
	c, err := dial(port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	k := &consumer{spec: s, c: c, recording: recording, done: make(chan struct{})}
	k.ackCond = sync.NewCond(&k.ackMu)
	if s.Prefetch > 0 {
		qos := methodFrame(1, 60, 10, buf{}.u32(0).u16(uint16(s.Prefetch)).u8(0))
		if _, err := c.callWithin(setupTimeout, qos, 60, 11); err != nil {
			return nil, err
		}
	}
	if queues == nil {
		queues = []string{s.Queue}
	}
	for lo := 0; lo < len(queues); lo += 1000 { // pipelined, 1,000 a write
		hi := min(len(queues), lo+1000)
		var out []byte
		for i, q := range queues[lo:hi] {
			out = append(out, methodFrame(1, 60, 20, buf{}.u16(0).short(q).
				short("bench"+strconv.Itoa(lo+i)).u8(bits(false, s.NoAck, false, false)).u32(0))...)
		}
		c.nc.SetDeadline(time.Now().Add(setupTimeout))
		if _, err := c.nc.Write(out); err != nil {
			return nil, err
		}
		for i := lo; i < hi; i++ {
			if _, err := c.wait(60, 21); err != nil {
				return nil, err
			}
		}
		c.nc.SetDeadline(time.Time{})
	}
	if s.AckDelayUS > 0 {
		k.work = make(chan uint64, 65536)
	}
	return k, nil
}

func (k *consumer) ack(tag uint64) {
	k.ackMu.Lock()
	k.acks = append(k.acks, ackFrame(tag)...)
	k.ackCond.Signal()
	k.ackMu.Unlock()
}

func (k *consumer) writeAcks() {
	var spare []byte
	for {
		k.ackMu.Lock()
		for len(k.acks) == 0 && !k.ackClosed {
			k.ackCond.Wait()
		}
		if k.ackClosed {
			k.ackMu.Unlock()
			return
		}
		out := k.acks
		k.acks = spare[:0]
		k.ackMu.Unlock()
		if _, err := k.c.nc.Write(out); err != nil {
			return
		}
		spare = out
	}
}

func (k *consumer) slowWorker() {
	delay := time.Duration(k.spec.AckDelayUS) * time.Microsecond
	for {
		select {
		case tag := <-k.work:
			time.Sleep(delay)
			k.ack(tag)
		case <-k.done:
			return
		}
	}
}

func (k *consumer) read() {
	var tag uint64
	var want, got int
	var head [16]byte
	for {
		typ, f, err := k.c.read()
		if err != nil {
			if !isTimeout(err) {
				k.err = err
			}
			return
		}
		switch typ {
		case 1:
			if binary.BigEndian.Uint16(f) == 60 && binary.BigEndian.Uint16(f[2:]) == 60 {
				tag = binary.BigEndian.Uint64(f[5+int(f[4]):]) // after the consumer tag
			} else if reason := k.c.closeReason(f); reason != "" {
				k.err = closedError{reason}
				return
			}
		case 2:
			want, got = int(binary.BigEndian.Uint64(f[4:])), 0
		case 3:
			if got < 16 {
				copy(head[got:], f)
			}
			got += len(f)
			if got >= want {
				k.delivered(tag, int64(binary.BigEndian.Uint64(head[:])))
			}
		}
	}
}

func (k *consumer) delivered(tag uint64, sentNS int64) {
	atomic.AddInt64(&k.received, 1)
	if atomic.LoadInt32(k.recording) == 1 {
		k.latencies = append(k.latencies, nowNS()-sentNS)
	}
	if k.spec.NoAck {
		return
	}
	if k.work == nil {
		k.ack(tag)
		return
	}
	select {
	case k.work <- tag:
	case <-k.done:
	}
}

func (k *consumer) stop() {
	close(k.done)
	k.ackMu.Lock()
	k.ackClosed = true
	k.ackCond.Broadcast()
	k.ackMu.Unlock()
	k.c.nc.SetDeadline(time.Now())
}

// -- load -------------------------------------------------------------------------

func runLoad(s Spec) (map[string]any, error) {
	admin, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	defer admin.nc.Close()
	for _, q := range s.Queues {
		declare := methodFrame(1, 50, 10,
			buf{}.u16(0).short(q).u8(bits(false, s.Durable, false, false, false)).u32(0))
		if _, err := admin.callWithin(setupTimeout, declare, 50, 11); err != nil {
			return nil, fmt.Errorf("queue.declare %s: %w", q, err)
		}
	}
	if s.ExchangeType != "" {
		if err := bindEveryQueue(admin, s); err != nil {
			return nil, err
		}
	}
	var keys, topicQueues []string
	if s.TopicBindings > 0 || s.TopicLiterals > 0 {
		if keys, topicQueues, err = setupTopic(admin, s); err != nil {
			return nil, err
		}
	}
	for _, ps := range s.Publishers {
		if ps.Rate > 0 && runtime.GOMAXPROCS(0) < 2 {
			// Pinned to one CPU, Go runs one P: a pacer asleep in nanosleep(2) would hold
			// it until sysmon takes it back (up to 10 ms when idle), stalling the readers.
			runtime.GOMAXPROCS(2)
		}
	}
	var recording int32
	consumers := make([]*consumer, 0, len(s.Consumers))
	for _, cs := range s.Consumers {
		var qs []string
		if topicQueues != nil && cs.Queue == s.Queues[0] {
			qs = topicQueues
		}
		k, err := newConsumer(s.Port, cs, &recording, qs)
		if err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
		defer k.c.nc.Close()
		consumers = append(consumers, k)
	}
	publishers := make([]*publisher, 0, len(s.Publishers))
	for _, ps := range s.Publishers {
		p, err := newPublisher(s.Port, ps, keys)
		if err != nil {
			return nil, fmt.Errorf("publisher: %w", err)
		}
		defer p.c.nc.Close()
		publishers = append(publishers, p)
	}
	emit(map[string]any{"ready": true})

	t0 := time.Now()
	winStart := t0.Add(time.Duration(s.WarmupS * float64(time.Second)))
	end := winStart.Add(time.Duration(s.WindowS * float64(time.Second)))
	var wg sync.WaitGroup
	for _, k := range consumers {
		wg.Add(1)
		go func(k *consumer) { defer wg.Done(); k.read() }(k)
		go k.writeAcks()
		if k.work != nil {
			go k.slowWorker()
		}
	}
	for _, p := range publishers {
		wg.Add(1)
		go func(p *publisher) { defer wg.Done(); p.write(end) }(p)
		go p.read()
	}

	snapshot := func() ([]int64, []int64, []int64) {
		sent, confirmed, received := []int64{}, []int64{}, []int64{}
		for _, p := range publishers {
			sent = append(sent, atomic.LoadInt64(&p.sent))
			confirmed = append(confirmed, p.confirmedCount())
		}
		for _, k := range consumers {
			received = append(received, atomic.LoadInt64(&k.received))
		}
		return sent, confirmed, received
	}
	time.Sleep(time.Until(winStart))
	sent0, conf0, recv0 := snapshot()
	cpu0 := cpuSeconds()
	atomic.StoreInt32(&recording, 1)
	time.Sleep(time.Until(end))
	atomic.StoreInt32(&recording, 0)
	sent1, conf1, recv1 := snapshot()
	cpu1, window := cpuSeconds(), time.Since(winStart).Seconds()
	emit(map[string]any{"window_end": true})

	for _, p := range publishers {
		p.stop()
	}
	for _, k := range consumers {
		k.stop()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
	}

	result := map[string]any{"window_s": window, "cpu_s": cpu1 - cpu0, "cpu_pct": 100 * (cpu1 - cpu0) / window}
	pubs := []map[string]any{}
	groups := map[string]map[string]any{}
	group := func(name string) map[string]any {
		if groups[name] == nil {
			groups[name] = map[string]any{"sent": int64(0), "confirmed": int64(0), "received": int64(0), "lat": []int64{}}
		}
		return groups[name]
	}
	for i, p := range publishers {
		p.mu.Lock()
		pubs = append(pubs, map[string]any{
			"group": p.spec.Group, "queue": p.spec.Queue, "sent": sent1[i] - sent0[i],
			"confirmed": conf1[i] - conf0[i], "blocked": p.blocked, "error": errText(p.err),
		})
		p.mu.Unlock()
		g := group(p.spec.Group)
		g["sent"] = g["sent"].(int64) + sent1[i] - sent0[i]
		g["confirmed"] = g["confirmed"].(int64) + conf1[i] - conf0[i]
	}
	cons := []map[string]any{}
	for i, k := range consumers {
		entry := summary(append([]int64(nil), k.latencies...))
		entry["group"], entry["queue"], entry["received"] = k.spec.Group, k.spec.Queue, recv1[i]-recv0[i]
		entry["error"] = errText(k.err)
		cons = append(cons, entry)
		g := group(k.spec.Group)
		g["received"] = g["received"].(int64) + recv1[i] - recv0[i]
		g["lat"] = append(g["lat"].([]int64), k.latencies...)
	}
	all := group("all")
	for name, g := range groups {
		if name != "all" {
			for _, key := range []string{"sent", "confirmed", "received"} {
				all[key] = all[key].(int64) + g[key].(int64)
			}
			all["lat"] = append(all["lat"].([]int64), g["lat"].([]int64)...)
		}
	}
	for _, g := range groups {
		for key, v := range summary(g["lat"].([]int64)) {
			g[key] = v
		}
		delete(g, "lat")
	}
	depth := map[string]any{}
	for _, q := range s.Queues {
		if n, err := admin.messageCount(q, 10*time.Second); err == nil {
			depth[q] = n
			if s.Cleanup {
				admin.callWithin(10*time.Second, methodFrame(1, 50, 40, buf{}.u16(0).short(q).u8(0)), 50, 41)
			}
		} else {
			depth[q] = nil
		}
	}
	result["publishers"], result["consumers"], result["groups"], result["depth"] = pubs, cons, groups, depth
	return result, nil
}

// bindEveryQueue: exchange mode's topology, the exchange declared and each queue bound.
func bindEveryQueue(admin *conn, s Spec) error {
	declare := methodFrame(1, 40, 10, buf{}.u16(0).short(s.Exchange).short(s.ExchangeType).u8(0).u32(0))
	if _, err := admin.callWithin(setupTimeout, declare, 40, 11); err != nil {
		return fmt.Errorf("exchange.declare %s: %w", s.Exchange, err)
	}
	for _, q := range s.Queues {
		bind := methodFrame(1, 50, 20, buf{}.u16(0).short(q).short(s.Exchange).short(q).u8(0).u32(0))
		if _, err := admin.callWithin(setupTimeout, bind, 50, 21); err != nil {
			return fmt.Errorf("queue.bind %s: %w", q, err)
		}
	}
	return nil
}

// topicTopology: (patterns, literal bindings, routing keys) of a topic-mode load.
//
//	prefixed  patterns s{i}.*.x (even i) / s{i}.# (odd i) for i < bindings, as
//	          bench/throughput.py and bench/topic_keys.py bind them; keys s{i}.w{j}.x
//	          (even i) / s{i}.w{j}.y (odd i), each matching exactly one pattern
//	leading   patterns *.e{i}.# (even i) / #.o{i} (odd i); keys p{j}.e{i}.z / p{j}.q.o{i}:
//	          one match per key, but no prefix of the key prunes the patterns
//
// Literal bindings are lit{i} for i < literals (no key matches them: they are there as
// the issue's ~1,000 extra bindings). Keys spread evenly over the patterns (key k uses
// i = k mod bindings, j = k div bindings), shuffled with a fixed seed.
func topicTopology(s Spec) ([]string, []string, []string, error) {
	n := s.TopicBindings
	var patterns, literals, keys []string
	for i := 0; i < s.TopicLiterals; i++ {
		literals = append(literals, "lit"+strconv.Itoa(i))
	}
	if n == 0 {
		return nil, literals, nil, errors.New("topic mode needs topic_bindings > 0")
	}
	for i := 0; i < n; i++ {
		switch s.TopicShape {
		case "", "prefixed":
			if i%2 == 0 {
				patterns = append(patterns, fmt.Sprintf("s%d.*.x", i))
			} else {
				patterns = append(patterns, fmt.Sprintf("s%d.#", i))
			}
		case "leading":
			if i%2 == 0 {
				patterns = append(patterns, fmt.Sprintf("*.e%d.#", i))
			} else {
				patterns = append(patterns, fmt.Sprintf("#.o%d", i))
			}
		default:
			return nil, nil, nil, fmt.Errorf("unknown topic_shape %q", s.TopicShape)
		}
	}
	for k := 0; k < s.TopicKeys; k++ {
		i, j := k%n, k/n
		even := i%2 == 0
		switch {
		case s.TopicShape == "leading" && even:
			keys = append(keys, fmt.Sprintf("p%d.e%d.z", j, i))
		case s.TopicShape == "leading":
			keys = append(keys, fmt.Sprintf("p%d.q.o%d", j, i))
		case even:
			keys = append(keys, fmt.Sprintf("s%d.w%d.x", i, j))
		default:
			keys = append(keys, fmt.Sprintf("s%d.w%d.y", i, j))
		}
	}
	// Fisher-Yates with a fixed linear congruential generator: the same order every run
	seed := uint64(1)
	for i := len(keys) - 1; i > 0; i-- {
		seed = seed*6364136223846793005 + 1442695040888963407
		j := int((seed >> 33) % uint64(i+1))
		keys[i], keys[j] = keys[j], keys[i]
	}
	return patterns, literals, keys, nil
}

// setupTopic declares the topic exchange and binds the first queue with every pattern and
// literal (pipelined, 1,000 binds a write), or with topic_queues > 0, declares queues
// "<first queue>.<k>" for k < topic_queues and binds pattern n to queue n mod topic_queues.
// Returns the routing keys the publishers cycle, and those queues (nil without them).
func setupTopic(admin *conn, s Spec) ([]string, []string, error) {
	patterns, literals, keys, err := topicTopology(s)
	if err != nil {
		return nil, nil, err
	}
	declare := methodFrame(1, 40, 10, buf{}.u16(0).short(s.Exchange).short("topic").u8(0).u32(0))
	if _, err := admin.callWithin(setupTimeout, declare, 40, 11); err != nil {
		return nil, nil, fmt.Errorf("exchange.declare %s: %w", s.Exchange, err)
	}
	admin.nc.SetDeadline(time.Now().Add(10 * setupTimeout))
	defer admin.nc.SetDeadline(time.Time{})
	pipelined := func(frames [][]byte, class, method uint16) error {
		for lo := 0; lo < len(frames); lo += 1000 {
			hi := min(len(frames), lo+1000)
			var out []byte
			for _, f := range frames[lo:hi] {
				out = append(out, f...)
			}
			if _, err := admin.nc.Write(out); err != nil {
				return err
			}
			for i := lo; i < hi; i++ {
				if _, err := admin.wait(class, method); err != nil {
					return err
				}
			}
		}
		return nil
	}
	queues := []string{s.Queues[0]}
	var named []string
	if s.TopicQueues > 0 {
		queues = nil
		var frames [][]byte
		for k := 0; k < s.TopicQueues; k++ {
			q := s.Queues[0] + "." + strconv.Itoa(k)
			queues = append(queues, q)
			frames = append(frames, queueDeclare(q, false, false, false))
		}
		if err := pipelined(frames, 50, 11); err != nil {
			return nil, nil, fmt.Errorf("queue.declare: %w", err)
		}
		named = queues
	}
	var frames [][]byte
	for n, key := range append(patterns, literals...) {
		frames = append(frames, methodFrame(1, 50, 20,
			buf{}.u16(0).short(queues[n%len(queues)]).short(s.Exchange).short(key).u8(0).u32(0)))
	}
	if err := pipelined(frames, 50, 21); err != nil {
		return nil, nil, fmt.Errorf("queue.bind: %w", err)
	}
	return keys, named, nil
}

// -- probe ------------------------------------------------------------------------

type probeStats struct {
	mu        sync.Mutex
	rtts      []int64
	inflight  int64 // send time (ns) of the request in flight, 0 if none
	err       error
	recording bool
}

func (st *probeStats) record(rtt int64) {
	st.mu.Lock()
	if st.recording {
		st.rtts = append(st.rtts, rtt)
	}
	st.inflight = 0
	st.mu.Unlock()
}

func (st *probeStats) begin() {
	st.mu.Lock()
	st.inflight = nowNS()
	st.mu.Unlock()
}

func (st *probeStats) fail(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
}

func (st *probeStats) reset() {
	st.mu.Lock()
	st.rtts, st.recording = nil, true
	st.mu.Unlock()
}

// result: the round trips, with one still in flight counted as lasting until now.
func (st *probeStats) result() map[string]any {
	st.mu.Lock()
	defer st.mu.Unlock()
	rtts := append([]int64(nil), st.rtts...)
	stalled := int64(0)
	if st.inflight != 0 {
		stalled = nowNS() - st.inflight
		rtts = append(rtts, stalled)
	}
	over := 0
	for _, r := range rtts {
		if r > 50e6 {
			over++
		}
	}
	out := summary(rtts)
	out["over_50ms"], out["in_flight_ms"], out["error"] = over, float64(stalled)/1e6, errText(st.err)
	return out
}

func runProbe(s Spec) error {
	c, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return err
	}
	// Named here, not by the broker: GarageMQ refuses server-named queues (503).
	name := fmt.Sprintf("overload-probe-%d", os.Getpid())
	ok, err := c.callWithin(setupTimeout, queueDeclare(name, false, true, true), 50, 11)
	if err != nil {
		return err
	}
	request := queueDeclare(string(ok[1:1+int(ok[0])]), true, false, false)
	interval := time.Duration(s.IntervalMS * float64(time.Millisecond))
	var rt, connect probeStats
	var stopped int32
	// Blocking system calls on the socket and for the sleep, on a locked thread: cheaper in
	// CPU and steadier in timing than the scheduler's network poller and timers at 1 kHz.
	file, err := c.nc.(*net.TCPConn).File()
	if err != nil {
		return err
	}
	fd := int(file.Fd()) // a blocking duplicate of the socket
	go func() {
		defer file.Close() // also keeps it (and so fd) from the garbage collector
		runtime.LockOSThread()
		reply := make([]byte, 4096)
		for atomic.LoadInt32(&stopped) == 0 {
			t := time.Now()
			rt.begin()
			if err := blockingRoundTrip(fd, request, reply); err != nil {
				rt.fail(err)
				return
			}
			rt.record(int64(time.Since(t)))
			if d := time.Until(t.Add(interval)); d > 0 {
				ts := syscall.NsecToTimespec(int64(d))
				syscall.Nanosleep(&ts, nil)
			}
		}
	}()
	if s.ConnectEveryMS > 0 {
		every := time.Duration(s.ConnectEveryMS * float64(time.Millisecond))
		go func() {
			header := []byte("AMQP\x00\x00\x09\x01")
			for atomic.LoadInt32(&stopped) == 0 {
				t := time.Now()
				connect.begin()
				if err := connectionStart(s.Port, header); err != nil {
					connect.fail(err)
				}
				connect.record(int64(time.Since(t)))
				time.Sleep(time.Until(t.Add(every)))
			}
		}()
	}
	emit(map[string]any{"ready": true})
	cpu0, t0 := cpuSeconds(), time.Now()
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if strings.TrimSpace(lines.Text()) == "start" {
			rt.reset()
			connect.reset()
			cpu0, t0 = cpuSeconds(), time.Now()
		}
	}
	atomic.StoreInt32(&stopped, 1)
	wall := time.Since(t0).Seconds()
	out := map[string]any{"round_trip": rt.result(), "cpu_s": cpuSeconds() - cpu0, "wall_s": wall}
	if s.ConnectEveryMS > 0 {
		out["connection_start"] = connect.result()
	}
	emit(out)
	return nil
}

// blockingRoundTrip: write request, read until one whole method frame has arrived (the
// probe's only reply: queue.declare-ok, small, never split across frames).
func blockingRoundTrip(fd int, request, reply []byte) error {
	for off := 0; off < len(request); {
		n, err := syscall.Write(fd, request[off:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		off += n
	}
	got := 0
	for got < 7 || got < 8+int(binary.BigEndian.Uint32(reply[3:])) {
		n, err := syscall.Read(fd, reply[got:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.EOF
		}
		got += n
	}
	if binary.BigEndian.Uint16(reply[7:]) != 50 || binary.BigEndian.Uint16(reply[9:]) != 11 {
		return fmt.Errorf("unexpected reply: class %d method %d", binary.BigEndian.Uint16(reply[7:]), binary.BigEndian.Uint16(reply[9:]))
	}
	return nil
}

// connectionStart: a new TCP connection, the protocol header, until connection.start arrives.
func connectionStart(port int, header []byte) error {
	nc, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 120*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(120 * time.Second))
	c := &conn{nc: nc, r: bufio.NewReader(nc)}
	if _, err := nc.Write(header); err != nil {
		return err
	}
	_, err = c.wait(10, 10)
	return err
}

// -- bad input --------------------------------------------------------------------

func deleteQueue(c *conn, q string) {
	c.callWithin(30*time.Second, methodFrame(1, 50, 40, buf{}.u16(0).short(q).u8(0)), 50, 41)
}

func runBadGetRecover(s Spec) (map[string]any, error) {
	admin, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	defer admin.nc.Close()
	if _, err := admin.callWithin(setupTimeout, queueDeclare(s.Queue, false, false, false), 50, 11); err != nil {
		return nil, err
	}
	big := message("", s.Queue, make([]byte, s.BodyBytes), admin.frameMax)
	if err := admin.publishConfirmed(1, func(int) []byte { return big }, setupTimeout); err != nil {
		return nil, err
	}
	bad, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	pair := append(methodFrame(1, 60, 70, buf{}.u16(0).short(s.Queue).u8(0)), // basic.get, no-ack off
		methodFrame(1, 60, 110, buf{}.u8(1))...) // basic.recover, requeue
	var requests []byte
	for len(requests) < s.RequestBytes {
		requests = append(requests, pair...)
	}
	emit(map[string]any{"ready": true})
	cpu0, t0 := cpuSeconds(), time.Now()
	hold := time.Duration(s.WindowS * float64(time.Second))
	bad.nc.SetWriteDeadline(t0.Add(hold))
	written, werr := bad.nc.Write(requests) // and never read
	writeS := time.Since(t0).Seconds()
	time.Sleep(time.Until(t0.Add(hold)))
	emit(map[string]any{"window_end": true})
	bad.nc.Close()
	result := map[string]any{
		"window_s": time.Since(t0).Seconds(), "cpu_s": cpuSeconds() - cpu0,
		"pairs": len(requests) / len(pair), "request_bytes": len(requests), "written_bytes": written,
		"write_s": writeS, "write_error": errText(werr),
	}
	if s.Cleanup {
		deleteQueue(admin, s.Queue)
	}
	return result, nil
}

func runBadNack(s Spec) (map[string]any, error) {
	admin, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	defer admin.nc.Close()
	if _, err := admin.callWithin(setupTimeout, queueDeclare(s.Queue, false, false, false), 50, 11); err != nil {
		return nil, err
	}
	body := make([]byte, 16)
	msg := message("", s.Queue, body, admin.frameMax)
	if err := admin.publishConfirmed(s.N, func(int) []byte { return msg }, setupTimeout); err != nil {
		return nil, err
	}
	bad, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	defer bad.nc.Close()
	timeout := time.Duration(s.TimeoutS * float64(time.Second))

	// take them all: the gets written by one goroutine, the get-oks read here
	get := methodFrame(1, 60, 70, buf{}.u16(0).short(s.Queue).u8(0))
	gets := make([]byte, 0, len(get)*s.N)
	for i := 0; i < s.N; i++ {
		gets = append(gets, get...)
	}
	tGet := time.Now()
	bad.nc.SetDeadline(tGet.Add(timeout))
	go bad.nc.Write(gets)
	var tags []uint64
	for len(tags) < s.N {
		typ, f, err := bad.read()
		if err != nil {
			return nil, fmt.Errorf("basic.get %d of %d: %w", len(tags), s.N, err)
		}
		if typ != 1 {
			continue
		}
		class, method := binary.BigEndian.Uint16(f), binary.BigEndian.Uint16(f[2:])
		switch {
		case class == 60 && method == 71:
			tags = append(tags, binary.BigEndian.Uint64(f[4:]))
		case class == 60 && method == 72:
			return nil, fmt.Errorf("basic.get-empty after %d of %d", len(tags), s.N)
		default:
			if reason := bad.closeReason(f); reason != "" {
				return nil, closedError{reason}
			}
		}
	}
	getS := time.Since(tGet).Seconds()
	sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })

	// then nack them one by one, ascending, and a passive declare behind them
	nacks := make([]byte, 0, 22*s.N+64)
	for _, tag := range tags {
		nacks = append(nacks, methodFrame(1, 60, 120, buf{}.u64(tag).u8(bits(false, true)))...)
	}
	nacks = append(nacks, queueDeclare(s.Queue, true, false, false)...)
	emit(map[string]any{"ready": true})
	cpu0, t0 := cpuSeconds(), time.Now()
	bad.nc.SetDeadline(t0.Add(timeout))
	go bad.nc.Write(nacks)
	ok, err := bad.wait(50, 11)
	nackS := time.Since(t0).Seconds()
	emit(map[string]any{"window_end": true})
	result := map[string]any{
		"n": s.N, "get_s": getS, "nack_s": nackS, "timed_out": isTimeout(err), "error": errText(err),
		"window_s": nackS, "cpu_s": cpuSeconds() - cpu0,
	}
	if err == nil {
		result["message_count"] = binary.BigEndian.Uint32(ok[1+int(ok[0]):])
	}
	if s.Cleanup {
		deleteQueue(admin, s.Queue)
	}
	return result, nil
}

func runBadBind(s Spec) (map[string]any, error) {
	admin, err := dial(s.Port, "/", setupTimeout)
	if err != nil {
		return nil, err
	}
	defer admin.nc.Close()
	declare := methodFrame(1, 40, 10, buf{}.u16(0).short(s.Exchange).short("topic").u8(0).u32(0))
	if _, err := admin.callWithin(setupTimeout, declare, 40, 11); err != nil {
		return nil, err
	}
	bind := func(q, pattern string) []byte {
		return methodFrame(1, 50, 20, buf{}.u16(0).short(q).short(s.Exchange).short(pattern).u8(0).u32(0))
	}
	for _, q := range []string{s.Queue, s.Queue2} {
		if _, err := admin.callWithin(setupTimeout, queueDeclare(q, false, false, false), 50, 11); err != nil {
			return nil, err
		}
	}
	// every key is "<i in base 36>.a.b.c...": `words` words, the second always "a"
	if _, err := admin.callWithin(setupTimeout, bind(s.Queue, "*.a.#"), 50, 21); err != nil {
		return nil, err
	}
	var tail strings.Builder
	for w := 1; w < s.Words; w++ {
		tail.WriteString("." + string(rune('a'+(w-1)%26)))
	}
	body := make([]byte, 16)
	key := func(i int) string { return strconv.FormatInt(int64(i), 36) + tail.String() }
	if len(key(s.Keys)) > 255 {
		return nil, fmt.Errorf("routing keys of %d words are longer than 255 bytes", s.Words)
	}
	publish := func(i int) []byte { return message(s.Exchange, key(i), body, admin.frameMax) }
	if err := admin.publishConfirmed(s.Keys, publish, setupTimeout); err != nil {
		return nil, err
	}
	var binds []byte // all sent at once, as a client declaring its bindings would
	for i := 0; i < s.Binds; i++ {
		binds = append(binds, bind(s.Queue2, fmt.Sprintf("#.zz%d.#", i))...)
	}
	emit(map[string]any{"ready": true})
	cpu0, t0 := cpuSeconds(), time.Now()
	admin.nc.SetDeadline(t0.Add(time.Duration(s.TimeoutS * float64(time.Second))))
	_, berr := admin.nc.Write(binds)
	var bindMS []float64 // the time from the previous bind-ok (the first: from the write)
	for last := t0; berr == nil && len(bindMS) < s.Binds; {
		if _, berr = admin.wait(50, 21); berr == nil {
			now := time.Now()
			bindMS = append(bindMS, now.Sub(last).Seconds()*1000)
			last = now
		}
	}
	admin.nc.SetDeadline(time.Time{})
	window := time.Since(t0).Seconds()
	emit(map[string]any{"window_end": true})
	result := map[string]any{
		"keys": s.Keys, "words": s.Words, "key_bytes": len(key(s.Keys - 1)), "bind_ms": bindMS,
		"binds_done": len(bindMS), "binds": s.Binds, "error": errText(berr),
		"window_s": window, "cpu_s": cpuSeconds() - cpu0,
	}
	if s.Cleanup && berr == nil {
		deleteQueue(admin, s.Queue)
		deleteQueue(admin, s.Queue2)
		admin.callWithin(30*time.Second, methodFrame(1, 40, 20, buf{}.u16(0).short(s.Exchange).u8(0)), 40, 21)
	}
	return result, nil
}
