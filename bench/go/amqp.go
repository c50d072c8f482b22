// The client's way in: a TCP connection to a broker on loopback, the AMQP 0-9-1 handshake
// (PLAIN guest/guest, publisher confirms, basic.nack and connection.blocked announced,
// the broker's frame size taken) into `vhost`, and channel 1 opened. Every role uses it.
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"time"
)

func dial(port int, vhost string, timeout time.Duration) (*conn, error) {
	nc, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), timeout)
	if err != nil {
		return nil, err
	}
	c := &conn{nc: nc, r: bufio.NewReaderSize(nc, 256*1024), frameMax: 131072}
	nc.SetDeadline(time.Now().Add(timeout))
	if err := c.handshake(vhost); err != nil {
		nc.Close()
		return nil, fmt.Errorf("handshake (vhost %q): %w", vhost, err)
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

func (c *conn) handshake(vhost string) error {
	if _, err := c.nc.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	if _, err := c.wait(10, 10); err != nil { // connection.start
		return err
	}
	caps := buf{}
	for _, k := range []string{"publisher_confirms", "basic.nack", "connection.blocked"} {
		caps = caps.short(k).u8('t').u8(1)
	}
	props := buf{}.short("product").u8('S').long("roarmq-bench-go")
	props = append(props.short("capabilities").u8('F').u32(uint32(len(caps))), caps...)
	startOk := append(buf{}.u32(uint32(len(props))), props...)
	startOk = startOk.short("PLAIN").long("\x00guest\x00guest").short("en_US")
	if _, err := c.nc.Write(methodFrame(0, 10, 11, startOk)); err != nil {
		return err
	}
	tune, err := c.wait(10, 30)
	if err != nil {
		return err
	}
	channelMax := binary.BigEndian.Uint16(tune)
	if fm := int(binary.BigEndian.Uint32(tune[2:])); fm > 0 {
		c.frameMax = fm
	}
	out := methodFrame(0, 10, 31, buf{}.u16(channelMax).u32(uint32(c.frameMax)).u16(0))
	out = append(out, methodFrame(0, 10, 40, buf{}.short(vhost).short("").u8(0))...)
	if _, err := c.nc.Write(out); err != nil {
		return err
	}
	if _, err := c.wait(10, 41); err != nil {
		return err
	}
	_, err = c.call(methodFrame(1, 20, 10, buf{}.short("")), 20, 11)
	return err
}
