package dsl_test

import (
	"fmt"
	"strings"

	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/dsl"
)

// A two-rank allgather: each rank tells its peer it has started, puts its
// input into the peer's output, signals that the data is there and waits
// for the peer's data. Compile checks it and writes the plan.
func Example() {
	p, err := dsl.New(dsl.Config{Name: "allgather2", Collective: dsl.AllGather, Ranks: 2, InPlace: true})
	if err != nil {
		panic(err)
	}
	// One memory channel each way; created in this order they pair up.
	ch := []*dsl.Channel{p.MemoryChannel(0, 1), p.MemoryChannel(1, 0)}
	for r := 0; r < 2; r++ {
		peer := 1 - r
		p.RelaxedSignal(0, ch[r])
		p.RelaxedWait(0, ch[r])
		p.Put(0, ch[r], p.Output(peer, r, 1), p.Input(r, 0, 1))
		p.Signal(0, ch[r])
		p.Wait(0, ch[r])
	}
	pl, _, err := p.Compile()
	if err != nil {
		panic(err)
	}
	var reg plan.Registry
	reg.Add(pl)
	e := reg.Select(plan.Query{Collective: "allgather", World: 2, InPlace: true, Bytes: 1 << 20})
	var names []string
	for _, o := range pl.GPUs[0].Threadblocks[0].Ops {
		names = append(names, o.Name)
	}
	fmt.Println(strings.Join(names, " "))
	fmt.Println("selected:", e.Plan.Name)
	// Output:
	// rlxsignal rlxwait nop put nop signal wait
	// selected: allgather2
}
