package bench

import (
	"fmt"
	"sort"
	"time"

	"github.com/goep-dev/goep/collectives"
)

// buildTuning turns --tune's measurements into a table: for each
// collective and mode, the fastest candidate at each size, NCCL included
// (with --compare nccl); sizes between two measured ones use the larger's
// rule. Every rank builds the same table (times are the slowest rank's),
// applies it, and rank 0 writes it.
func (r *collRun) buildTuning() (*collectives.Tuning, error) {
	info := r.dev.Info()
	t := &collectives.Tuning{Version: collectives.TuningVersion, Device: info.Name, World: r.c.Size(),
		Created: time.Now().UTC().Format(time.RFC3339),
		Note:    fmt.Sprintf("ep-bench collectives --tune, %s %s; eager and flushed times make the mode-independent rules, graph times the graph rules", r.o.dt, r.o.op)}
	type key struct {
		coll, mode string
		bytes      int64
	}
	best := map[key]collRow{}
	bestReg := map[key]collRow{} // fastest that needs no registration
	for _, row := range r.rows {
		if row.US <= 0 || row.Error != "" || row.Mode == "check" {
			continue
		}
		mode := "graph"
		if row.Mode != "graph" {
			mode = ""
		}
		k := key{row.Collective, mode, row.Bytes}
		if b, ok := best[k]; !ok || row.US < b.US {
			best[k] = row
		}
		if row.Algorithm != collectives.AlgoZC {
			if b, ok := bestReg[k]; !ok || row.US < b.US {
				bestReg[k] = row
			}
		}
	}
	keys := make([]key, 0, len(best))
	for k := range best {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.coll != b.coll {
			return a.coll < b.coll
		}
		if a.mode != b.mode {
			return a.mode < b.mode
		}
		return a.bytes < b.bytes
	})
	for i, k := range keys {
		b := best[k]
		rule := collectives.Rule{Collective: k.coll, Mode: k.mode, MaxBytes: k.bytes, Algorithm: b.Algorithm, Blocks: b.Blocks}
		if u, ok := bestReg[k]; ok && b.Algorithm == collectives.AlgoZC {
			rule.Unregistered, rule.UnregisteredBlocks = u.Algorithm, u.Blocks
		}
		first := i == 0 || keys[i-1].coll != k.coll || keys[i-1].mode != k.mode
		if n := len(t.Rules); n > 0 && !first {
			p := &t.Rules[n-1]
			if p.Algorithm == rule.Algorithm && p.Blocks == rule.Blocks && p.Unregistered == rule.Unregistered &&
				p.UnregisteredBlocks == rule.UnregisteredBlocks {
				p.MaxBytes = rule.MaxBytes // the same choice: extend the previous rule
			} else {
				t.Rules = append(t.Rules, rule)
			}
		} else {
			t.Rules = append(t.Rules, rule)
		}
		last := i == len(keys)-1 || keys[i+1].coll != k.coll || keys[i+1].mode != k.mode
		if last && k.mode == "" {
			t.Rules[len(t.Rules)-1].MaxBytes = 0 // the largest size's choice covers everything above it
		}
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	r.c.SetTuning(t)
	if r.c.Rank() == 0 {
		if err := t.Save(r.o.tuneOut); err != nil {
			return nil, err
		}
	}
	// The selector now picks the fastest: confirm it on this rank.
	for _, k := range keys {
		kind, _ := collectives.ParseKind(k.coll)
		got, err := r.c.Select(kind, int(k.bytes)/r.o.dt.Size(), r.o.dt, r.o.op, true, k.mode == "graph")
		if err != nil {
			return nil, err
		}
		if want := best[k].Algorithm; got != want {
			return nil, fmt.Errorf("tuning table: %s %s %s selects %s, the fastest was %s", k.coll, k.mode, human(int(k.bytes)), got, want)
		}
	}
	return t, nil
}
