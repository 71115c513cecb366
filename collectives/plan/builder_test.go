package plan

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Hand-written 2-rank plans for the op tests. Both ranks run the same
// threadblocks; PEER in the JSON becomes the other rank. Each rank has one
// memory and one port channel to the peer, and remote buffers (through
// both channel types, in this order): the peer's i, o and s.

type spec struct {
	proto    string // Simple (default) or LL
	in, out  int    // chunks (default 2, 2)
	scr      int    // scratch chunks (default 4)
	double   bool
	sems     []int // init values
	tbs      []string
	extraTop string
}

// Remote buffer ids as threadblocks see them (both access types list the
// same three buffers in the same order).
const (
	peerI = 0
	peerO = 1
	peerS = 2
)

func (s spec) json() string {
	if s.proto == "" {
		s.proto = "Simple"
	}
	if s.in == 0 && s.out == 0 {
		s.in, s.out = 2, 2
	}
	if s.scr == 0 {
		s.scr = 4
	}
	sems := make([]string, len(s.sems))
	for i, v := range s.sems {
		sems[i] = fmt.Sprintf(`{"init_value":%d}`, v)
	}
	var gpus []string
	for id := 0; id < 2; id++ {
		g := fmt.Sprintf(`{"id":%d,"input_chunks":%d,"output_chunks":%d,"scratch_chunks":%d,
"channels":[{"channel_type":"memory","connected_to":[PEER]},{"channel_type":"port","connected_to":[PEER]}],
"remote_buffers":[{"rank":PEER,"type":"i","access_channel_types":["memory","port"]},{"rank":PEER,"type":"o","access_channel_types":["memory","port"]},{"rank":PEER,"type":"s","access_channel_types":["memory","port"]}],
"semaphores":[%s],"threadblocks":[%s]}`, id, s.in, s.out, s.scr, strings.Join(sems, ","), strings.Join(s.tbs, ","))
		gpus = append(gpus, strings.ReplaceAll(g, "PEER", strconv.Itoa(1-id)))
	}
	return fmt.Sprintf(`{"name":"t","collective":"custom","protocol":%q,"inplace":false,"use_double_scratch_buffer":%v,%s"gpus":[%s]}`,
		s.proto, s.double, s.extraTop, strings.Join(gpus, ","))
}

// tb is threadblock id with every channel and remote buffer and the ops.
func tb(id int, ops ...string) string {
	return fmt.Sprintf(`{"id":%d,"channels":[{"channel_type":"memory","channel_ids":[0]},{"channel_type":"port","channel_ids":[0]}],
"remote_buffer_refs":[{"access_channel_type":"memory","remote_buffer_ids":[0,1,2]},{"access_channel_type":"port","remote_buffer_ids":[0,1,2]}],
"ops":[%s]}`, id, strings.Join(ops, ","))
}

// op is {"name":name, fields...}; fields are raw JSON members.
func op(name string, fields ...string) string {
	return fmt.Sprintf(`{"name":%q%s}`, name, prefixComma(fields))
}

func prefixComma(f []string) string {
	if len(f) == 0 {
		return ""
	}
	return "," + strings.Join(f, ",")
}

func src(refs ...string) string { return `"src_buff":[` + strings.Join(refs, ",") + `]` }
func dst(refs ...string) string { return `"dst_buff":[` + strings.Join(refs, ",") + `]` }
func loc(t string, i, n int) string {
	return fmt.Sprintf(`{"type":%q,"index":%d,"size":%d}`, t, i, n)
}
func rem(id, i, n int) string { return fmt.Sprintf(`{"buffer_id":%d,"index":%d,"size":%d}`, id, i, n) }

const (
	memory = `"channel_type":"memory"`
	port   = `"channel_type":"port"`
	ch0    = `"channel_ids":[0]`
)

// chunks is the test's chunk size in bytes (sizes are 2 chunks).
const chunks = 32

// runSpec runs a spec'd plan on 2 host ranks with input size 2 chunks
// (int32 small integers unless dt says otherwise) and returns inputs and
// outputs; outputs start zeroed.
func runSpec(t *testing.T, s spec, dt DataType, cfg HostConfig, launches int) (in, out [][]byte) {
	t.Helper()
	p := mustParse(t, s.json())
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	w, err := NewHostWorld(p, 2, 2*chunks*uint64(max(1, p.GPUs[0].InputChunks))/2, false, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for l := 0; l < launches; l++ {
		in, out = make([][]byte, 2), make([][]byte, 2)
		for r := 0; r < 2; r++ {
			in[r] = make([]byte, w.Resolved(r).InputBytes)
			out[r] = make([]byte, w.Resolved(r).OutputBytes)
			FillSmallInt(dt, r, uint64(l+1), in[r])
		}
		if err := w.Run(context.Background(), dt, in, out); err != nil {
			t.Fatal(err)
		}
	}
	return in, out
}

// runSpecErr runs and returns the launch's error (short timeout).
func runSpecErr(t *testing.T, s spec) error {
	t.Helper()
	p := mustParse(t, s.json())
	w, err := NewHostWorld(p, 2, 2*chunks, false, HostConfig{Timeout: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	in := [][]byte{make([]byte, 2*chunks), make([]byte, 2*chunks)}
	out := [][]byte{make([]byte, 2*chunks), make([]byte, 2*chunks)}
	return w.Run(context.Background(), Int32, in, out)
}

// chunk returns chunk k of b.
func chunk(b []byte, k int) []byte { return b[k*chunks : (k+1)*chunks] }

// sum returns the element-wise reduction of parts (plain loop).
func sum(dt DataType, op ReduceOp, parts ...[]byte) []byte {
	out := make([]byte, len(parts[0]))
	reduceRanks(dt, op, parts, out)
	return out
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func zeros(n int) []byte { return make([]byte, n) }

func expectOut(t *testing.T, out [][]byte, want ...[]byte) {
	t.Helper()
	for r := range want {
		if i := firstDiff(out[r], want[r]); i >= 0 {
			t.Fatalf("rank %d: output differs at byte %d (got % x, want % x)", r, i, out[r], want[r])
		}
	}
}
