package dsl

import (
	"fmt"

	"github.com/goep-dev/goep/collectives/plan"
)

// Checks made when an op is recorded: everything that can be said of one op
// alone. Errors are kept and returned by Compile, prefixed with the op.

func (p *Program) rankErr(r int) error {
	if r < 0 || r >= p.cfg.Ranks {
		return fmt.Errorf("rank %d out of range (the program has %d ranks)", r, p.cfg.Ranks)
	}
	return nil
}

// chunkErr checks a chunk's buffer and range.
func (p *Program) chunkErr(c Chunk) error {
	if err := p.rankErr(c.Rank); err != nil {
		return fmt.Errorf("chunk %s: %w", c, err)
	}
	n := MaxScratchChunks
	switch c.Buf {
	case Input:
		n = p.inChunks
	case Output:
		n = p.outChunks
	case Scratch:
	default:
		return fmt.Errorf("chunk %s: unknown buffer", c)
	}
	if c.Size < 1 || c.Index < 0 || c.Index > n-c.Size {
		return fmt.Errorf("chunk %s is out of bounds (the %s has %d chunks)", c, c.Buf, n)
	}
	return nil
}

// known says whether ch is a channel of this program.
func (p *Program) known(ch *Channel) bool { return ch != nil && ch.p == p }

func isPacketOp(k opKind) bool {
	switch k {
	case opPutPackets, opReadPutPackets, opCopyPackets, opUnpackPackets, opReducePackets, opReduceSendPackets:
		return true
	}
	return false
}

func (p *Program) checkOp(o *op) error {
	if len(o.chans) > 0 && !p.known(o.chans[0]) {
		return fmt.Errorf("unknown channel (nil or made by another program)")
	}
	if (o.kind == opSemAcquire || o.kind == opSemRelease) && (o.sem == nil || o.sem.p != p) {
		return fmt.Errorf("unknown semaphore (nil or made by another program)")
	}
	if err := p.rankErr(o.rank); err != nil {
		return err
	}
	if limit := plan.MaxThreadblocks / p.cfg.Instances; o.tb < 0 || o.tb >= limit {
		return fmt.Errorf("threadblock %d out of range (want 0..%d with %d instances)", o.tb, limit-1, p.cfg.Instances)
	}
	if isPacketOp(o.kind) && p.cfg.Protocol != LL {
		return fmt.Errorf("packet operations need protocol LL (the program is %s)", p.cfg.Protocol)
	}
	var ct ChanType
	if len(o.chans) > 0 {
		ct = o.chans[0].Type
	}
	switch o.kind {
	case opGet:
		if ct != Memory {
			return fmt.Errorf("get needs a memory channel")
		}
	case opFlush, opPutSignal, opPutSignalFlush:
		if ct != Port {
			return fmt.Errorf("%s needs a port channel", o.kind)
		}
	case opReadReduce:
		if len(o.src) < 2 || len(o.src) > plan.MaxOperands-1 {
			return fmt.Errorf("%d remote sources (want 1..%d)", len(o.src)-1, plan.MaxOperands-2)
		}
	case opReduce, opReducePackets:
		if len(o.src) < 1 || len(o.src) > plan.MaxOperands-1 {
			return fmt.Errorf("%d sources (want 1..%d)", len(o.src), plan.MaxOperands-1)
		}
	case opPipeline:
		if o.unit == 0 || o.unit%8 != 0 || o.unit > 1<<40 || o.numChunks < 1 || o.numChunks > 1<<20 {
			return fmt.Errorf("unit of %d bytes over %d chunks (want a positive multiple of 8 bytes, at least one chunk)", o.unit, o.numChunks)
		}
	}
	if o.parent != nil && (o.kind == opBarrier || o.kind == opPipeline) {
		return fmt.Errorf("%s cannot be inside a pipeline", o.kind)
	}
	// Operands: local ones on the op's rank, remote ones on the other end
	// of a channel of the op's rank; all of one size.
	size := -1
	for _, list := range [][]ref{o.src, o.dst} {
		for _, r := range list {
			if err := p.chunkErr(r.c); err != nil {
				return err
			}
			if size >= 0 && r.c.Size != size {
				return fmt.Errorf("chunk %s has %d chunks, the op's other operands %d (an op moves one size)", r.c, r.c.Size, size)
			}
			size = r.c.Size
			if r.ch == nil {
				if r.c.Rank != o.rank {
					return fmt.Errorf("chunk %s is not on rank %d, which runs the op", r.c, o.rank)
				}
				continue
			}
			if !p.known(r.ch) {
				return fmt.Errorf("chunk %s: unknown channel (nil or made by another program)", r.c)
			}
			if r.ch.From != o.rank || r.c.Rank != r.ch.To {
				return fmt.Errorf("chunk %s through %s: the channel must lead from rank %d to the chunk's rank", r.c, r.ch, o.rank)
			}
			if o.kind == opReadReduce && r.ch.Type != Memory {
				return fmt.Errorf("chunk %s: read-reduce reads through memory channels only", r.c)
			}
		}
	}
	// The threads of an op share its chunks out among them: a destination
	// that overlaps a source other than exactly (an in-place reduction)
	// would be read and written at once.
	l := layout{p.cfg.InPlace, p.inChunks, p.outChunks}
	for _, d := range o.dst {
		for _, s := range o.src {
			db, di := l.canon(d.c.Rank, d.c.Buf, d.c.Index)
			sb, si := l.canon(s.c.Rank, s.c.Buf, s.c.Index)
			if d.c.Rank == s.c.Rank && db == sb && di < si+s.c.Size && si < di+d.c.Size && di != si {
				return fmt.Errorf("destination %s overlaps source %s (an op's threads read and write its chunks at once)", d.c, s.c)
			}
		}
	}
	// Packets live in scratch: where they are written to peers and read.
	scratch := func(r ref, what string) error {
		if r.c.Buf != Scratch {
			return fmt.Errorf("chunk %s: %s must be in scratch", r.c, what)
		}
		return nil
	}
	switch o.kind {
	case opPutPackets, opReadPutPackets:
		if err := scratch(o.dst[0], "packets sent to a peer"); err != nil {
			return err
		}
		if o.kind == opReadPutPackets || ct == Port {
			return scratch(o.src[0], "packets forwarded")
		}
	case opUnpackPackets:
		return scratch(o.src[0], "packets read")
	case opReducePackets:
		for _, r := range o.src[1:] {
			if err := scratch(r, "packets read"); err != nil {
				return err
			}
		}
	}
	return nil
}
