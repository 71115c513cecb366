package plan

import (
	"strings"
	"testing"
)

// One test per op of the format (multicast ones excepted), each with a
// small hand-written 2-rank plan whose result is computed independently.

var sync2 = []string{op("signal", memory, ch0), op("wait", memory, ch0)}

func TestOpNopAndCopy(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("nop"), op("copy", src(loc("i", 0, 2)), dst(loc("o", 0, 2))), op("nop"))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	expectOut(t, out, in[0], in[1])
}

func TestOpPutSignalWait(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("put", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), sync2[0], sync2[1])}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpRelaxedSignalWait(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("put", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))),
		op("rlxsignal", memory, ch0), op("rlxwait", memory, ch0))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	expectOut(t, out, in[1], in[0])
}

func TestOpGet(t *testing.T) {
	// Inputs are ready before the launch; the trailing signal/wait keeps a
	// rank's input alive until the peer has read it.
	s := spec{tbs: []string{tb(0, op("get", memory, ch0, src(rem(peerI, 1, 1)), dst(loc("o", 0, 1))), sync2[0], sync2[1])}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	expectOut(t, out, cat(chunk(in[1], 1), zeros(chunks)), cat(chunk(in[0], 1), zeros(chunks)))
}

func TestOpReduce(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("re", `"reduce_op":"sum"`, src(loc("i", 0, 1), loc("i", 1, 1)), dst(loc("o", 1, 1))))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	f := func(b []byte) []byte { return cat(zeros(chunks), sum(Int32, ReduceSum, chunk(b, 0), chunk(b, 1))) }
	expectOut(t, out, f(in[0]), f(in[1]))
}

func TestOpReduceSend(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("res", memory, src(loc("i", 0, 1), loc("i", 1, 1)), dst(loc("o", 0, 1), rem(peerO, 1, 1))), sync2[0], sync2[1])}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	r := func(b []byte) []byte { return sum(Int32, ReduceSum, chunk(b, 0), chunk(b, 1)) }
	expectOut(t, out, cat(r(in[0]), r(in[1])), cat(r(in[1]), r(in[0])))
}

func TestOpReadReduce(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("rre", memory, src(loc("i", 0, 2), rem(peerI, 0, 2)), dst(loc("o", 0, 2))), sync2[0], sync2[1])}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	all := sum(Int32, ReduceSum, in[0], in[1])
	expectOut(t, out, all, all)
}

func TestOpReadReduceSend(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("rres", memory, src(loc("i", 0, 1), rem(peerI, 0, 1)), dst(loc("o", 0, 1), rem(peerO, 1, 1))), sync2[0], sync2[1])}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	c := sum(Int32, ReduceSum, chunk(in[0], 0), chunk(in[1], 0))
	expectOut(t, out, cat(c, c), cat(c, c))
}

// Reductions honour reduce_op and the data type.
func TestReduceOpsAndTypes(t *testing.T) {
	for _, dt := range DataTypes {
		for _, ro := range []ReduceOp{ReduceSum, ReduceMin, ReduceMax} {
			s := spec{tbs: []string{tb(0, op("rre", memory, `"reduce_op":"`+ro.String()+`"`, src(loc("i", 0, 2), rem(peerI, 0, 2)), dst(loc("o", 0, 2))), sync2[0], sync2[1])}}
			in, out := runSpec(t, s, dt, HostConfig{}, 1)
			all := sum(dt, ro, in[0], in[1])
			expectOut(t, out, all, all)
		}
	}
	s := spec{tbs: []string{tb(0, op("rre", memory, `"reduce_op":"prod"`, src(loc("i", 0, 2), rem(peerI, 0, 2)), dst(loc("o", 0, 2))))}}
	if _, err := Parse([]byte(s.json())); err == nil || !strings.Contains(err.Error(), `unknown reduce_op "prod"`) {
		t.Fatalf("reduce_op prod: %v", err)
	}
}

// LL: ppkt packs into the peer's scratch, upkt waits and unpacks.
func TestOpPutPacketsUnpack(t *testing.T) {
	for _, pt := range []PacketType{LL16, LL8} {
		s := spec{proto: "LL", double: true, tbs: []string{
			tb(0, op("ppkt", memory, src(loc("i", 0, 2)), dst(rem(peerS, 0, 2)))),
			tb(1, op("upkt", src(loc("s", 0, 2)), dst(loc("o", 0, 2)))),
		}}
		in, out := runSpec(t, s, Int32, HostConfig{Packet: pt}, 3) // 3 launches: both halves, flags 1..3
		expectOut(t, out, in[1], in[0])
	}
}

// cpkt packs locally, rppkt waits for those packets and forwards them.
func TestOpCopyPacketsReadPut(t *testing.T) {
	s := spec{proto: "LL", tbs: []string{
		tb(0, op("cpkt", src(loc("i", 0, 2)), dst(loc("s", 0, 2)))),
		tb(1, op("rppkt", memory, src(loc("s", 0, 2)), dst(rem(peerS, 2, 2)))),
		tb(2, op("upkt", src(loc("s", 2, 2)), dst(loc("o", 0, 2)))),
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpReducePackets(t *testing.T) {
	s := spec{proto: "LL", tbs: []string{
		tb(0, op("ppkt", memory, src(loc("i", 0, 2)), dst(rem(peerS, 0, 2)))),
		tb(1, op("repkt", `"reduce_op":"max"`, src(loc("i", 0, 2), loc("s", 0, 2)), dst(loc("o", 0, 2)))),
	}}
	in, out := runSpec(t, s, FP16, HostConfig{}, 2)
	m := sum(FP16, ReduceMax, in[0], in[1])
	expectOut(t, out, m, m)
}

func TestOpReduceSendPackets(t *testing.T) {
	s := spec{proto: "LL", tbs: []string{
		tb(0, op("ppkt", memory, src(loc("i", 0, 1)), dst(rem(peerS, 0, 1)))),
		tb(1, op("respkt", memory, src(loc("i", 0, 1), loc("s", 0, 1)), dst(loc("o", 0, 1), rem(peerS, 2, 1)))),
		tb(2, op("upkt", src(loc("s", 2, 1)), dst(loc("o", 1, 1)))),
	}}
	in, out := runSpec(t, s, BF16, HostConfig{}, 2)
	c := sum(BF16, ReduceSum, chunk(in[0], 0), chunk(in[1], 0))
	expectOut(t, out, cat(c, c), cat(c, c))
}

func TestOpReduceCopyPackets(t *testing.T) {
	s := spec{proto: "LL", tbs: []string{
		tb(0, op("ppkt", memory, src(loc("i", 0, 1)), dst(rem(peerS, 0, 1)))),
		tb(1, op("recpkt", src(loc("i", 0, 1), loc("s", 0, 1)), dst(loc("o", 0, 1), loc("s", 2, 1)))),
		tb(2, op("upkt", src(loc("s", 2, 1)), dst(loc("o", 1, 1)))),
	}}
	in, out := runSpec(t, s, FP32, HostConfig{}, 2)
	c := sum(FP32, ReduceSum, chunk(in[0], 0), chunk(in[1], 0))
	expectOut(t, out, cat(c, c), cat(c, c))
}

func TestOpReduceCopySendPackets(t *testing.T) {
	s := spec{proto: "LL", scr: 5, tbs: []string{
		tb(0, op("ppkt", memory, src(loc("i", 0, 1)), dst(rem(peerS, 0, 1)))),
		tb(1, op("recspkt", memory, src(loc("i", 0, 1), loc("s", 0, 1)), dst(loc("o", 0, 1), loc("s", 2, 1), rem(peerS, 3, 1)))),
		tb(2, op("upkt", src(loc("s", 3, 1)), dst(loc("o", 1, 1)))),
		tb(3, op("upkt", src(loc("s", 2, 1)), dst(loc("s", 4, 1)))), // the local packets are there too
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	c := sum(Int32, ReduceSum, chunk(in[0], 0), chunk(in[1], 0))
	expectOut(t, out, cat(c, c), cat(c, c))
}

// Port channels: the proxy does the put; flush waits for it; the signal
// after it orders the data before the peer's wait.
func TestOpPortPutFlushSignal(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("put", port, ch0, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))),
		op("flush", port, ch0), op("signal", port, ch0), op("wait", port, ch0))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpPutWithSignal(t *testing.T) {
	s := spec{tbs: []string{tb(0, op("pws", port, ch0, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), op("wait", port, ch0))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpPutWithSignalAndFlush(t *testing.T) {
	// After pwsf the source may be overwritten (here with zeros from
	// scratch): the proxy has already read it.
	s := spec{tbs: []string{tb(0, op("pwsf", port, ch0, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))),
		op("copy", src(loc("s", 0, 2)), dst(loc("i", 0, 2))), op("wait", port, ch0))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	orig := [2][]byte{make([]byte, len(in[0])), make([]byte, len(in[1]))}
	for r := range orig {
		FillSmallInt(Int32, r, 1, orig[r])
		if firstDiff(in[r], zeros(len(in[r]))) >= 0 {
			t.Fatalf("rank %d: input not overwritten", r)
		}
	}
	expectOut(t, out, orig[1], orig[0])
}

// Port ppkt forwards packets already in local scratch (with the local
// scratch as source: upstream's missing memory-id base is not copied).
func TestOpPortPutPackets(t *testing.T) {
	s := spec{proto: "LL", double: true, tbs: []string{
		tb(0, op("cpkt", src(loc("i", 0, 2)), dst(loc("s", 0, 2))), op("nop"),
			op("ppkt", port, ch0, src(loc("s", 0, 2)), dst(rem(peerS, 2, 2)))),
		tb(1, op("upkt", src(loc("s", 2, 2)), dst(loc("o", 0, 2)))),
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpPortReadPutPackets(t *testing.T) {
	s := spec{proto: "LL", tbs: []string{
		tb(0, op("cpkt", src(loc("i", 0, 2)), dst(loc("s", 0, 2)))),
		tb(1, op("rppkt", port, ch0, src(loc("s", 0, 2)), dst(rem(peerS, 2, 2)))),
		tb(2, op("upkt", src(loc("s", 2, 2)), dst(loc("o", 0, 2)))),
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[1], in[0])
}

func TestOpBarrier(t *testing.T) {
	bar := op("barrier", `"barrier_id":3`, `"num_threadblocks":2`)
	s := spec{tbs: []string{
		tb(0, op("copy", src(loc("i", 0, 2)), dst(loc("s", 0, 2))), bar, bar),
		tb(1, bar, op("copy", src(loc("s", 0, 2)), dst(loc("o", 0, 2))), bar),
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[0], in[1])
}

func TestOpSemaphores(t *testing.T) {
	s := spec{sems: []int{0, 1}, tbs: []string{
		tb(0, op("sem_acquire", `"semaphore_ids":[1]`), op("copy", src(loc("i", 0, 2)), dst(loc("s", 0, 2))),
			op("sem_release", `"semaphore_ids":[0,1]`)),
		tb(1, op("sem_acquire", `"semaphore_ids":[0]`), op("copy", src(loc("s", 0, 2)), dst(loc("o", 0, 2)))),
	}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 2)
	expectOut(t, out, in[0], in[1])
}

// A pipeline runs its body over unit-size slices; signal/wait pair up per
// iteration.
func TestOpPipeline(t *testing.T) {
	for _, unit := range []int{8, 16, 24, 64} {
		body := strings.Join([]string{
			op("put", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), sync2[0], sync2[1],
		}, ",")
		pipe := op("pipeline", `"iter_context":{"unit_size":`+itoa(unit)+`,"num_chunks":2}`, `"ops":[`+body+`]`)
		s := spec{tbs: []string{tb(0, pipe)}}
		in, out := runSpec(t, s, Int32, HostConfig{}, 1)
		expectOut(t, out, in[1], in[0])
		p := mustParse(t, s.json())
		r, err := Resolve(p, 0, 2*chunks, false)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Blocks[0].Instrs[0].Iterations, uint64((2*chunks+unit-1)/unit); got != want {
			t.Fatalf("unit %d: %d iterations, want %d", unit, got, want)
		}
	}
}

// tbg_info splits each operand across a group of blocks.
func TestOpTBGInfo(t *testing.T) {
	cp := func(id int) string {
		return op("copy", `"tbg_info":{"tb_id":`+itoa(id)+`,"tbg_size":3}`, src(loc("i", 0, 2)), dst(loc("o", 0, 2)))
	}
	s := spec{tbs: []string{tb(0, cp(0)), tb(1, cp(1)), tb(2, cp(2))}}
	in, out := runSpec(t, s, Int32, HostConfig{}, 1)
	expectOut(t, out, in[0], in[1])
	r, err := Resolve(mustParse(t, s.json()), 0, 2*chunks, false)
	if err != nil {
		t.Fatal(err)
	}
	// 64 bytes = 4 units of 16 over 3 blocks: 2, 1, 1 units.
	for i, want := range [][2]uint64{{0, 32}, {32, 16}, {48, 16}} {
		o := r.Blocks[i].Instrs[0].Src[0]
		if o.Offset != want[0] || o.Size != want[1] {
			t.Fatalf("block %d: [%d, +%d), want [%d, +%d)", i, o.Offset, o.Size, want[0], want[1])
		}
	}
}

func itoa(i int) string { return describe(i) }
