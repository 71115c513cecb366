package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Malformed plans are errors that say where, never panics or hangs.
func TestMalformedPlans(t *testing.T) {
	good := spec{tbs: []string{tb(0, op("put", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), sync2[0], sync2[1])}}.json()
	manyOps := make([]string, MaxOpsPerBlock+1)
	for i := range manyOps {
		manyOps[i] = op("nop")
	}
	cases := []struct {
		name, json, want string
	}{
		{"truncated", good[:len(good)/2], "truncated JSON"},
		{"not json", "{nope", "invalid JSON at line 1"},
		{"wrong type", strings.Replace(good, `"inplace":false`, `"inplace":"no"`, 1), `field "inplace"`},
		{"wrong nested type", strings.Replace(good, `"index":0`, `"index":"0"`, 1), `field "gpus.threadblocks.ops.src_buff.index"`},
		{"missing gpus", `{"name":"x","collective":"c","protocol":"Simple","inplace":false}`, `field "gpus" is missing`},
		{"bad protocol", strings.Replace(good, `"protocol":"Simple"`, `"protocol":"LL128"`, 1), `field "protocol"`},
		{"unknown op", strings.Replace(good, `"name":"put"`, `"name":"teleport"`, 1), `gpu 0: threadblock 0: op 0 (teleport): field "name": unknown op "teleport"`},
		{"glre", strings.Replace(good, `"name":"put"`, `"name":"glre"`, 1), `standalone`},
		{"channel out of range", strings.Replace(good, `"name":"signal","channel_type":"memory","channel_ids":[0]`, `"name":"signal","channel_type":"memory","channel_ids":[3]`, 1),
			`gpu 0: threadblock 0: op 1 (signal): field "channel_ids": memory channel 3 out of range`},
		{"buffer ref out of range", strings.Replace(good, `{"buffer_id":1,`, `{"buffer_id":9,`, 1), `op 0 (put): field "dst_buff": ref 0: buffer_id 9 out of range`},
		{"chunks past buffer", strings.Replace(good, `{"type":"i","index":0,"size":2}`, `{"type":"i","index":1,"size":2}`, 1), `chunks [1, 3) beyond the buffer's 2 chunks`},
		{"dangling remote buffer", strings.Replace(good, `"remote_buffer_ids":[0,1,2]}`, `"remote_buffer_ids":[0,1,7]}`, 1), `remote_buffer_ids": 7 out of range`},
		{"peer out of range", strings.Replace(good, `"connected_to":[1]`, `"connected_to":[5]`, 1), `peer 5`},
		{"too many ops", spec{tbs: []string{tb(0, manyOps...)}}.json(), "65 ops after pipelines are flattened"},
		{"gpu id", strings.Replace(good, `{"id":1,"input_chunks"`, `{"id":0,"input_chunks"`, 1), `gpu 1: field "id"`},
		{"min above max", strings.Replace(good, `"gpus":`, `"min_message_size":10,"max_message_size":5,"gpus":`, 1), "min_message_size"},
		{"negative max", strings.Replace(good, `"gpus":`, `"max_message_size":-1,"gpus":`, 1), `field "max_message_size"`},
		{"nested pipeline", spec{tbs: []string{tb(0, op("pipeline", `"iter_context":{"unit_size":16,"num_chunks":1}`,
			`"ops":[`+op("pipeline", `"iter_context":{"unit_size":16,"num_chunks":1}`, `"ops":[`+op("nop")+`]`)+`]`))}}.json(), "do not nest"},
		{"barrier blocks", spec{tbs: []string{tb(0, op("barrier", `"barrier_id":0`, `"num_threadblocks":3`))}}.json(), "num_threadblocks"},
		{"semaphore id", spec{tbs: []string{tb(0, op("sem_release", `"semaphore_ids":[0]`))}}.json(), "semaphore 0 out of range"},
		{"packets to output", spec{proto: "LL", tbs: []string{tb(0, op("ppkt", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))))}}.json(), "packets go to a peer's scratch"},
		{"sizes differ", spec{tbs: []string{tb(0, op("copy", src(loc("i", 0, 2)), dst(loc("o", 0, 1))))}}.json(), "an op moves one size"},
		{"port put without channel", spec{tbs: []string{tb(0, op("put", port, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))))}}.json(), "thread i uses channel i"},
		{"alignment", strings.Replace(good, `"gpus":`, `"buffer_alignment":12,"gpus":`, 1), "buffer_alignment"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.json))
			if err == nil {
				t.Fatalf("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// Call-time refusals: world, size range, in-place mode, multicast.
func TestResolveRefusals(t *testing.T) {
	p := loadTestPlan(t, "allreduce.json")
	if _, err := NewHostWorld(p, 4, 1024, true, HostConfig{}); err == nil || !strings.Contains(err.Error(), "written for 8 GPUs, the world has 4") {
		t.Fatalf("world: %v", err)
	}
	if _, err := Resolve(p, 0, 1024, false); err == nil || !strings.Contains(err.Error(), "the plan is in-place, the call out-of-place") {
		t.Fatalf("in-place: %v", err)
	}
	js := strings.Replace(spec{tbs: []string{tb(0, op("nop"))}}.json(), `"gpus":`, `"min_message_size":128,"max_message_size":4096,"gpus":`, 1)
	q := mustParse(t, js)
	for _, n := range []uint64{64, 8192} {
		if _, err := Resolve(q, 0, n, false); err == nil || !strings.Contains(err.Error(), "outside the plan's [128, 4096]") {
			t.Fatalf("size %d: %v", n, err)
		}
	}
	if _, err := Resolve(q, 0, 4096, false); err != nil {
		t.Fatal(err)
	}
	// A multicast plan parses, and is refused at execution.
	sw := spec{tbs: []string{tb(0, op("nop"))}}.json()
	for _, peer := range []string{"0", "1"} {
		sw = strings.Replace(sw, `"connected_to":[`+peer+`]},{"channel_type":"port"`,
			`"connected_to":[`+peer+`]},{"channel_type":"switch","buffer_type":"i","rank_groups":[{"size":2,"ranks":[0,1]}]},{"channel_type":"port"`, -1)
	}
	sw = strings.Replace(sw, `{"name":"nop"}`, `{"name":"glres","src_buff":[{"switch_channel_id":0,"index":0,"size":1}],"dst_buff":[{"switch_channel_id":0,"index":0,"size":1}]}`, -1)
	sw = strings.Replace(sw, `"channels":[{"channel_type":"memory","channel_ids":[0]}`, `"channels":[{"channel_type":"switch","channel_ids":[0]},{"channel_type":"memory","channel_ids":[0]}`, -1)
	ps, err := Parse([]byte(sw))
	if err != nil {
		t.Fatalf("switch plan should parse: %v", err)
	}
	if _, err := NewHostWorld(ps, 2, 64, false, HostConfig{}); err == nil || !strings.Contains(err.Error(), "multicast") {
		t.Fatalf("switch plan: %v", err)
	}
}

// A wrong plan fails with an error naming rank, threadblock and op, in
// about the timeout: never a hang.
func TestRunErrors(t *testing.T) {
	cases := []struct {
		name string
		s    spec
		want string
	}{
		{"missing signal", spec{tbs: []string{tb(0, op("wait", memory, ch0))}}, "threadblock 0: op 0 (wait): timed out after 200ms waiting for signal 1 on memory channel 0 from rank"},
		{"missing packets", spec{proto: "LL", tbs: []string{tb(0, op("upkt", src(loc("s", 0, 2)), dst(loc("o", 0, 2))))}}, "op 0 (upkt): timed out after 200ms waiting for LL packet 0"},
		{"barrier short", spec{tbs: []string{tb(0, op("barrier", `"barrier_id":0`, `"num_threadblocks":2`)), tb(1, op("nop"))}}, "op 0 (barrier): timed out after 200ms waiting for barrier 0 (2 blocks)"},
		{"semaphore never released", spec{sems: []int{0}, tbs: []string{tb(0, op("sem_acquire", `"semaphore_ids":[0]`))}}, "waiting for semaphore 0"},
		{"port wait", spec{tbs: []string{tb(0, op("put", port, ch0, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), op("wait", port, ch0))}}, "op 1 (wait): timed out"},
		{"pipeline", spec{tbs: []string{tb(0, op("pipeline", `"iter_context":{"unit_size":16,"num_chunks":2}`, `"ops":[`+op("wait", memory, ch0)+`]`))}}, "op 0 (pipeline) body op 0 (wait): iteration 0: timed out"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := runSpecErr(t, c.s)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v does not say %q", err, c.want)
			}
			if !strings.Contains(err.Error(), `plan "t": rank `) {
				t.Fatalf("error %v does not name plan and rank", err)
			}
		})
	}
}

// Every shipped plan loads; its Resolve for every rank stays in the
// upstream limits the GPU interpreter packs into.
func TestShippedPlansResolve(t *testing.T) {
	for _, name := range planFiles(t) {
		p := loadTestPlan(t, name)
		for r := 0; r < p.World(); r++ {
			res, err := Resolve(p, r, 1<<20, p.InPlace)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for _, b := range res.Blocks {
				if len(b.MemoryChannels) > MaxChannelsPerBlock || len(b.PortChannels) > MaxChannelsPerBlock {
					t.Fatalf("%s: rank %d block %d: too many channels", name, r, b.ID)
				}
				flat := 0
				for _, in := range b.Instrs {
					flat += 1 + len(in.Body)
				}
				if flat > MaxOpsPerBlock {
					t.Fatalf("%s: rank %d block %d: %d ops", name, r, b.ID, flat)
				}
			}
		}
	}
}

// The registry picks by collective, world, ranks per node, in-place mode,
// size and reduction; priority then registration order break ties; an
// Accept hook declines.
func TestRegistrySelect(t *testing.T) {
	reg := &Registry{}
	entries, err := reg.AddDir(filepath.Join("testdata", "plans"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(planFiles(t)) {
		t.Fatalf("%d entries", len(entries))
	}
	q := Query{Collective: "allreduce", World: 2, RanksPerNode: 2, InPlace: true, Bytes: 1 << 20}
	if e := reg.Select(q); e == nil || e.Plan.Name != "reduce" { // reduce.json sorts before reduce_pack.json
		t.Fatalf("allreduce 2: %v", e)
	}
	hi := reg.Add(loadTestPlan(t, "reduce_pack.json"), WithPriority(5))
	if e := reg.Select(q); e != hi {
		t.Fatalf("priority: %v", e)
	}
	hi.Accept = func(q Query) bool { return q.Bytes <= 4096 }
	if e := reg.Select(q); e == nil || e.Plan.Name != "reduce" {
		t.Fatalf("declined: %v", e)
	}
	q.Bytes = 4096
	if e := reg.Select(q); e != hi {
		t.Fatalf("accepted: %v", e)
	}
	for _, miss := range []Query{
		{Collective: "allreduce", World: 4, RanksPerNode: 4, InPlace: true, Bytes: 4096},
		{Collective: "allreduce", World: 2, RanksPerNode: 2, InPlace: false, Bytes: 4096},
		{Collective: "allreduce", World: 2, RanksPerNode: 2, InPlace: true, Bytes: 4096, Op: ReduceMax},
		{Collective: "broadcast", World: 2, RanksPerNode: 2, InPlace: true, Bytes: 4096},
	} {
		if e := reg.Select(miss); e != nil {
			t.Fatalf("%+v matched %s", miss, e.Plan.Name)
		}
	}
	if e := reg.Select(Query{Collective: "all_gather", World: 8, RanksPerNode: 8, InPlace: true, Bytes: 1024}); e == nil || e.Plan.Name != "allgather_pkt" {
		t.Fatalf("allgather 8: %v", e)
	}
	r8 := &Registry{}
	r8.Add(loadTestPlan(t, "alltoall.json"), WithRanksPerNode(4))
	if e := r8.Select(Query{Collective: "alltoall", World: 8, RanksPerNode: 8, InPlace: true, Bytes: 1 << 12}); e != nil {
		t.Fatal("ranks per node ignored")
	}
	if _, err := reg.AddDir(t.TempDir() + "/none"); err == nil {
		t.Fatal("missing directory accepted")
	}
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "x.json"), []byte("{"), 0o644)
	if _, err := reg.AddDir(bad); err == nil || !strings.Contains(err.Error(), "x.json") {
		t.Fatalf("bad dir: %v", err)
	}
}
