package bootstrap

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Data frames after the handshake: a 16-byte header (tag int64, payload
// length uint32, magic uint32, big-endian) and the payload. The magic catches
// a desynchronised or foreign stream before we trust its length.
const (
	frameMagic     uint32 = 0x67657066 // "gepf"
	frameHeaderLen        = 16
)

func encodeHeader(tag int64, n int) [frameHeaderLen]byte {
	var h [frameHeaderLen]byte
	binary.BigEndian.PutUint64(h[0:8], uint64(tag))
	binary.BigEndian.PutUint32(h[8:12], uint32(n))
	binary.BigEndian.PutUint32(h[12:16], frameMagic)
	return h
}

// readFrame reads one data frame. Errors are worded for PeerClosedError.
func readFrame(r *bufio.Reader) (tag int64, payload []byte, err error) {
	var h [frameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, describeReadErr(err)
	}
	if m := binary.BigEndian.Uint32(h[12:16]); m != frameMagic {
		return 0, nil, fmt.Errorf("protocol error: bad frame magic %#x", m)
	}
	n := binary.BigEndian.Uint32(h[8:12])
	if n > MaxMessageSize {
		return 0, nil, fmt.Errorf("protocol error: frame of %d bytes exceeds the %d-byte limit", n, MaxMessageSize)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, describeReadErr(err)
	}
	return int64(binary.BigEndian.Uint64(h[0:8])), payload, nil
}

func describeReadErr(err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("connection closed (%w)", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("connection closed in the middle of a message (%w)", err)
	}
	return err
}

// Handshake messages are length-prefixed JSON: rare, small, and easy to
// extend and to read in a packet capture.
const (
	protoName       = "goep-bootstrap/1"
	kindRegister    = "register" // rank -> root
	kindPeer        = "peer"     // lower rank -> higher rank, building the mesh
	maxHandshakeLen = 16 << 20   // an address table for ~100k ranks
)

type helloMsg struct {
	Proto string `json:"proto"`
	Kind  string `json:"kind"`
	ID    string `json:"id"`
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	Addr  string `json:"addr,omitempty"` // where the sender accepts peers (register only)
}

// replyMsg answers a hello; Error non-empty means rejected.
type replyMsg struct {
	Error string `json:"error,omitempty"`
}

// tableMsg is the root's second message to a registered rank: either the
// address of every rank, or why the root gave up.
type tableMsg struct {
	Addrs   []string `json:"addrs,omitempty"`
	Abort   string   `json:"abort,omitempty"`
	Missing []int    `json:"missing,omitempty"` // set when the root timed out waiting for these
}

func writeMsg(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

func readMsg(r *bufio.Reader, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return describeReadErr(err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxHandshakeLen {
		return fmt.Errorf("handshake message of %d bytes is too large (not a goep bootstrap peer?)", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return describeReadErr(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("malformed handshake message (not a goep bootstrap peer?): %w", err)
	}
	return nil
}
