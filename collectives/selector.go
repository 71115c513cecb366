package collectives

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Tuning is the selector's table, written by `ep-bench collectives --tune`
// from measurements of every algorithm (NCCL's too) on the machine, and
// loaded with LoadTuning, Config.Tuning or $GOEP_COLL_TUNING. Every rank
// must use the same table: the choice must agree across ranks.
type Tuning struct {
	Version int    `json:"version"`
	Device  string `json:"device,omitempty"`
	World   int    `json:"world"`
	Created string `json:"created,omitempty"`
	Note    string `json:"note,omitempty"`
	Rules   []Rule `json:"rules"`
}

// Rule picks an algorithm for calls of one collective up to MaxBytes per
// rank (the whole buffer for allreduce, one rank's part for allgather and
// reduce-scatter; 0 means no bound). Mode "graph" or "eager" restricts a
// rule to calls captured into CUDA graphs or not, DType to one element
// type. Among the rules covering a call, the most specific wins (mode and
// type matched), then the one with the smallest MaxBytes.
type Rule struct {
	Collective string `json:"collective"`
	Mode       string `json:"mode,omitempty"`
	DType      string `json:"dtype,omitempty"`
	MaxBytes   int64  `json:"max_bytes"`
	Algorithm  string `json:"algorithm"`
	Blocks     int    `json:"blocks,omitempty"`
	// Unregistered is the choice when Algorithm is zc but the buffers are
	// not registered (default: the built-in rules decide).
	Unregistered       string `json:"unregistered,omitempty"`
	UnregisteredBlocks int    `json:"unregistered_blocks,omitempty"`
}

// id is a short fingerprint of the table ("none" without one), which
// debug mode compares across ranks.
func (t *Tuning) id() string {
	if t == nil {
		return "none"
	}
	b, _ := json.Marshal(t.Rules)
	sum := sha256.Sum256(append(b, byte(t.World)))
	return hex.EncodeToString(sum[:6])
}

// TuningVersion is the table format this package writes and reads.
const TuningVersion = 1

// LoadTuning reads a table written by SaveTuning.
func LoadTuning(path string) (*Tuning, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseTuning(b, "tuning table "+path)
}

// parseTuning decodes and validates a table; what names it in errors.
func parseTuning(b []byte, what string) (*Tuning, error) {
	var t Tuning
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return &t, nil
}

// Save writes t as indented JSON.
func (t *Tuning) Save(path string) error {
	if t == nil {
		return errors.New("collectives: save of a nil tuning table")
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Validate checks versions, names and modes.
func (t *Tuning) Validate() error {
	if t == nil {
		return errors.New("nil tuning table")
	}
	if t.Version != TuningVersion {
		return fmt.Errorf("version %d, this build reads %d", t.Version, TuningVersion)
	}
	for i, r := range t.Rules {
		k, err := ParseKind(r.Collective)
		if err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
		if !validAlgo(k, r.Algorithm) || (r.Unregistered != "" && !validAlgo(k, r.Unregistered)) {
			return fmt.Errorf("rule %d: %s has no algorithm %q/%q (have %s)", i, k, r.Algorithm, r.Unregistered, strings.Join(Algorithms(k), ", "))
		}
		if r.Mode != "" && r.Mode != "graph" && r.Mode != "eager" {
			return fmt.Errorf("rule %d: mode %q (want graph, eager or empty)", i, r.Mode)
		}
		if r.DType != "" {
			if _, err := parseDataType(r.DType); err != nil {
				return fmt.Errorf("rule %d: %w", i, err)
			}
		}
		if r.MaxBytes < 0 || r.Blocks < 0 || r.UnregisteredBlocks < 0 {
			return fmt.Errorf("rule %d: negative bound", i)
		}
	}
	return nil
}

func validAlgo(k Kind, name string) bool {
	for _, a := range Algorithms(k) {
		if a == name {
			return true
		}
	}
	return false
}

// rule returns the table's rule for x, if any applies.
func (t *Tuning) rule(x *call, world int) *Rule {
	if t == nil || t.World != world {
		return nil
	}
	var best *Rule
	for i := range t.Rules {
		r := &t.Rules[i]
		if !strings.EqualFold(strings.ReplaceAll(r.Collective, "_", ""), x.kind.String()) {
			continue
		}
		if r.Mode != "" && r.Mode != x.mode() {
			continue
		}
		if r.DType != "" {
			if d, err := parseDataType(r.DType); err != nil || d != x.dt {
				continue
			}
		}
		if r.MaxBytes != 0 && int64(x.size()) > r.MaxBytes {
			continue
		}
		if best == nil || less(r, best) {
			best = r
		}
	}
	return best
}

// less orders the rules covering a call: the more specific first (a rule
// for graph calls beats a rule for any call, whatever their bounds), then
// the tighter size bound.
func less(a, b *Rule) bool {
	if sa, sb := specificity(a), specificity(b); sa != sb {
		return sa > sb
	}
	return bound(a) < bound(b)
}

func bound(r *Rule) int64 {
	if r.MaxBytes == 0 {
		return 1 << 62
	}
	return r.MaxBytes
}

func specificity(r *Rule) int {
	s := 0
	if r.Mode != "" {
		s++
	}
	if r.DType != "" {
		s++
	}
	return s
}

// Built-in thresholds (per-rank bytes), used without a table or when a
// table's choice cannot run the call. They follow MSCCL++'s selector for
// Hopper without NVLS, scaled to the LL algorithms here; a tuning table
// replaces them.
const (
	builtinARLL  = 64 << 10
	builtinARLL2 = 2 << 20
	builtinAGLL  = 128 << 10
	builtinRSLL  = 256 << 10
)

// builtin is the built-in choice for x: the LL algorithms for small
// messages, then zero-copy when the buffers are registered, else scratch.
func (c *Communicator) builtin(x *call) string {
	n := x.size()
	order := []string{}
	switch x.kind {
	case AllReduce:
		if n <= builtinARLL {
			order = append(order, AlgoLL)
		}
		if n <= builtinARLL2 {
			order = append(order, AlgoLL2)
		}
	case AllGather:
		if n <= builtinAGLL {
			order = append(order, AlgoLL)
		}
	case ReduceScatter:
		if n <= builtinRSLL {
			order = append(order, AlgoLL)
		}
	}
	order = append(order, AlgoZC, AlgoScratch, AlgoNCCL)
	for _, a := range order {
		if c.whyNot(a, x) == "" {
			return a
		}
	}
	return ""
}

// choose sets x.algo (and x.blocks): the forced algorithm, else the tuning
// table's, else the built-in rules'. It fails with the reasons when nothing
// can run the call.
func (c *Communicator) choose(x *call) error {
	if x.forced {
		if why := c.whyNot(x.algo, x); why != "" {
			return c.errorf("%s: algorithm %s cannot run it: %s", x, x.algo, why)
		}
		return nil
	}
	if r := c.tuning.rule(x, c.size); r != nil {
		if c.whyNot(r.Algorithm, x) == "" {
			x.algo, x.blocks = r.Algorithm, r.Blocks
			return nil
		}
		if r.Unregistered != "" && c.whyNot(r.Unregistered, x) == "" {
			x.algo, x.blocks = r.Unregistered, r.UnregisteredBlocks
			return nil
		}
	}
	if a := c.builtin(x); a != "" {
		x.algo = a
		return nil
	}
	// Nothing runs it: say why for the native algorithms and for NCCL.
	var why []string
	if s := nativeType(x); s != "" {
		why = append(why, s)
	} else if !c.native {
		why = append(why, c.whyNot(AlgoScratch, x))
	}
	why = append(why, "NCCL fallback: "+c.ncclWhyNot())
	return c.errorf("%s is not supported: %s", x, strings.Join(why, "; "))
}

// Select returns the algorithm the communicator would use for a call
// (registered: the buffers are registered; graph: the call is captured),
// for diagnostics and tools.
func (c *Communicator) Select(k Kind, count int, dt DataType, op Op, registered, graph bool) (string, error) {
	if c == nil {
		return "", ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x := &call{kind: k, count: count, dt: dt, op: op, captured: graph}
	if registered {
		x.sendReg, x.recvReg = &Registration{}, &Registration{}
	}
	if err := c.choose(x); err != nil {
		return "", err
	}
	return x.algo, nil
}

// CanRun reports why algorithm algo cannot run such a call (nil when it
// can; with registered, as if the buffers were registered).
func (c *Communicator) CanRun(k Kind, algo string, count int, dt DataType, op Op, registered bool) error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x := &call{kind: k, count: count, dt: dt, op: op}
	if registered {
		x.sendReg, x.recvReg = &Registration{}, &Registration{}
	}
	if !validAlgo(k, algo) {
		return c.errorf("%s: no algorithm %q (have %s)", k, algo, strings.Join(Algorithms(k), ", "))
	}
	if why := c.whyNot(algo, x); why != "" {
		return c.errorf("%s: %s cannot run it: %s", x, algo, why)
	}
	return nil
}

// SortRules orders a table's rules by collective, mode and size bound (for
// readable files).
func (t *Tuning) SortRules() {
	if t == nil {
		return
	}
	sort.SliceStable(t.Rules, func(i, j int) bool {
		a, b := t.Rules[i], t.Rules[j]
		if a.Collective != b.Collective {
			return a.Collective < b.Collective
		}
		if a.Mode != b.Mode {
			return a.Mode < b.Mode
		}
		return bound(&a) < bound(&b)
	})
}

func parseDataType(s string) (DataType, error) {
	for _, d := range []DataType{BF16, FP16, FP32, FP8E4M3} {
		if strings.EqualFold(s, d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown data type %q", s)
}
